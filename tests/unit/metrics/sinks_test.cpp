#include "metrics/sinks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

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
