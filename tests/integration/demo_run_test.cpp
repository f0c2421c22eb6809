// The demo as scripts/demo runs it (configs/tiny.yaml on 2 local ranks, from the repository root),
// against what README.md says it prints: the final train and eval losses lie in the ranges the
// README states. The ranges are read from the README, so the page and the test cannot drift apart.

#include <unistd.h>

#include <regex>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

struct Range {
  double low = 0;
  double high = 0;
};

// "<what> between <low> and <high>" in README.md.
Range readme_range(const std::string& what) {
  const std::string readme = read_text(DSTRAIN_SOURCE_DIR "/README.md");
  // A sentence may wrap anywhere: any run of whitespace matches a space.
  const std::string words = std::regex_replace(what, std::regex(" "), R"(\s+)");
  const std::regex pattern(words + R"(\s+between\s+([0-9]+\.[0-9]+)\s+and\s+([0-9]+\.[0-9]+))");
  std::smatch m;
  EXPECT_TRUE(std::regex_search(readme, m, pattern))
      << "README.md does not say '" << what << " between <low> and <high>'";
  if (m.empty()) return {};
  return {std::stod(m[1]), std::stod(m[2])};
}

TEST(Demo, FinalLossesAreInTheRangesTheReadmeStates) {
  const Range train = readme_range("final train loss");
  const Range eval = readme_range("final eval loss");
  ASSERT_LT(train.low, train.high);
  ASSERT_LT(eval.low, eval.high);

  TempDir dir;
  ASSERT_EQ(::chdir(DSTRAIN_SOURCE_DIR), 0);  // the config's paths are relative to the checkout
  const RunResult r = launch_job("configs/tiny.yaml", 2,
                                 {"logging.out_dir=" + dir.file("run"),
                                  "checkpoint.dir=" + dir.file("ckpt"), "logging.progress=false"},
                                 600);
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  const auto summary = nlohmann::json::parse(read_text(dir.file("run/summary.json")));
  EXPECT_EQ(summary["steps"], 300);
  const double train_loss = summary["train_loss"].get<double>();
  const double eval_loss = summary["eval_loss"].get<double>();
  EXPECT_GE(train_loss, train.low);
  EXPECT_LE(train_loss, train.high);
  EXPECT_GE(eval_loss, eval.low);
  EXPECT_LE(eval_loss, eval.high);
  // The numbers the run prints are the ones checked.
  const std::string done = "done: 300 steps, train loss " + fmt::format("{:.4f}", train_loss) +
                           ", eval loss " + fmt::format("{:.4f}", eval_loss);
  EXPECT_NE(r.out.find(done), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dstrain::testing
