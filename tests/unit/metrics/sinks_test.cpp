#include "metrics/sinks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrics/progress.h"
#include "metrics/system.h"

namespace dstrain::metrics {
namespace {

TEST(JsonlSink, WritesOneParsableObjectPerRecordInOrder) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("dstrain_metrics_" + std::to_string(::getpid())) / "m.jsonl";
  {
    JsonlSink sink(path.string());
    Record r1{1, {}};
    r1.add("train/loss", 2.5);
    r1.add("lr", 1e-3);
    sink.write(r1);
    Record r2{2, {}};
    r2.add("train/loss", std::nan(""));
    sink.write(r2);
  }
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  auto j = nlohmann::ordered_json::parse(line);
  EXPECT_EQ(j["step"], 1);
  EXPECT_DOUBLE_EQ(j["train/loss"].get<double>(), 2.5);
  EXPECT_EQ(j.begin().key(), "step");
  std::getline(in, line);
  j = nlohmann::ordered_json::parse(line);
  EXPECT_TRUE(j["train/loss"].is_null());
  std::filesystem::remove_all(path.parent_path());
}

// A run resumed at step 4 of a file that the interrupted run had written up to step 6, its last
// line cut short by the crash: steps 5 and 6 and the cut line go, step 4 stays, new lines follow.
TEST(JsonlSink, AResumedRunDropsTheStepsItWritesAgain) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dstrain_metrics_resume_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = dir / "m.jsonl";
  std::ofstream(path) << "{\"step\":2,\"train/loss\":3.0}\n{\"step\":4,\"eval/loss\":2.0}\n"
                      << "{\"step\":5,\"train/loss\":2.5}\n{\"step\":6,\"train/lo";
  {
    JsonlSink sink(path.string(), /*resumed_at=*/4);
    Record r{5, {}};
    r.add("train/loss", 2.25);
    sink.write(r);
  }
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["step"], 2);
  EXPECT_EQ(lines[1]["step"], 4);
  EXPECT_EQ(lines[2]["step"], 5);
  EXPECT_DOUBLE_EQ(lines[2]["train/loss"].get<double>(), 2.25);
  {
    JsonlSink fresh(path.string());  // a new run starts the file afresh
  }
  EXPECT_EQ(std::filesystem::file_size(path), 0u);
  std::filesystem::remove_all(dir);
}

TEST(ProgressSink, LineShowsStepLossLrThroughputAndEta) {
  Record r{120, {}};
  r.add("train/loss", 2.31415);
  r.add("lr", 0.0029);
  r.add("tokens_per_s", 5812.4);
  r.add("eta_s", 65);
  EXPECT_EQ(ProgressSink::format_line(r, 500),
            "step 120/500 | loss 2.3142 | lr 2.900e-03 | 5812 tok/s | ETA 1m05s");
}

TEST(FormatDuration, UsesLargestSensibleUnits) {
  EXPECT_EQ(format_duration(42), "42s");
  EXPECT_EQ(format_duration(185), "3m05s");
  EXPECT_EQ(format_duration(3720), "1h02m");
}

TEST(Mfu, IsAchievedOverPeakAndZeroWhenPeakUnknown) {
  EXPECT_DOUBLE_EQ(mfu(6e9, 1000, 12e12), 0.5);
  EXPECT_DOUBLE_EQ(mfu(6e9, 1000, 0), 0.0);
}

TEST(Rss, IsPositiveAndPeakIsAtLeastCurrent) {
  EXPECT_GT(current_rss_bytes(), 0);
  EXPECT_GE(peak_rss_bytes(), current_rss_bytes() / 2);
}

}  // namespace
}  // namespace dstrain::metrics
