#include "launcher/elastic_batch.h"

#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/common/temp_dir.h"

namespace dstrain::launcher {
namespace {

TEST(ElasticBatch, ShrunkWorldsAreTheSumsOfAtLeastMinNodes) {
  EXPECT_EQ(shrunk_worlds({1, 1, 1}, 2), (std::set<int>{2}));
  EXPECT_EQ(shrunk_worlds({2, 2, 2, 2}, 1), (std::set<int>{2, 4, 6}));
  EXPECT_EQ(shrunk_worlds({1, 2, 4}, 1), (std::set<int>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(shrunk_worlds({4}, 1).empty());
}

// A world the job could shrink to that sequence-parallel groups do not divide is refused at plan
// time, whatever --elastic-batch says; one they divide passes.
TEST(ElasticBatch, ShrinkingToAWorldTheSequenceParallelSizeDoesNotDivideIsRefused) {
  testing::TempDir tmp;
  LocalLaunchOptions launch;
  launch.config_path = (tmp / "run.yaml").string();
  std::ofstream(launch.config_path) << "model:\n  name_or_path: m\ndata:\n  train_path: t.txt\n"
                                    << "parallel:\n  sequence_parallel_size: 2\n";
  for (bool allow_change : {false, true}) {
    try {
      check_elastic_batch(launch, allow_change, 3, {1, 1, 1, 1}, "host(s)");
      ADD_FAILURE() << "a shrink to 3 ranks with sequence_parallel_size 2 was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kConfig);
      EXPECT_NE(std::string(e.what()).find("shrink to 3 rank(s)"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("sequence_parallel_size 2"), std::string::npos)
          << e.what();
    }
  }
  EXPECT_NO_THROW(check_elastic_batch(launch, false, 1, {2, 2}, "host(s)"));
}

}  // namespace
}  // namespace dstrain::launcher
