// `dstrain estimate` as a user runs it: the table for the config's model on nodes × GPUs ranks,
// and bad input as exit code 2.

#include <gtest/gtest.h>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

const std::string kTiny = DSTRAIN_SOURCE_DIR "/configs/tiny.yaml";

TEST(EstimateCli, PrintsEveryStageForNodesTimesGpusRanks) {
  const RunResult r = run_dstrain({"estimate", kTiny, "--nodes", "2", "--gpus", "4", "--set",
                                   "model.name_or_path=" DSTRAIN_SOURCE_DIR "/configs/models/tiny"},
                                  {}, 30);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("1017216 trainable parameters, 8 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("3     optimizer+param"), std::string::npos) << r.out;
}

TEST(EstimateCli, BadInputIsExitTwo) {
  RunResult r = run_dstrain({"estimate", "/nonexistent/run.yaml"}, {}, 30);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("/nonexistent/run.yaml"), std::string::npos) << r.err;
  r = run_dstrain({"estimate", kTiny, "--gpus", "0"}, {}, 30);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
}

}  // namespace
}  // namespace dstrain::testing
