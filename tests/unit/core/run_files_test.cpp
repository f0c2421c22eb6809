#include "core/run_files.h"

#include <gtest/gtest.h>

namespace dstrain::run_files {
namespace {

TEST(RunFiles, EveryFileLiesInTheRunDirectory) {
  EXPECT_EQ(metrics_file("runs/a", ""), "runs/a/metrics.jsonl");
  EXPECT_EQ(summary_file("runs/a"), "runs/a/summary.json");
  EXPECT_EQ(config_file("runs/a"), "runs/a/config.yaml");
  EXPECT_EQ(restarts_file("runs/a"), "runs/a/restarts.json");
  EXPECT_EQ(report_file("runs/a"), "runs/a/report.html");
  EXPECT_EQ(trace_dir("runs/a"), "runs/a/trace");
  EXPECT_EQ(rank_trace_file("runs/a", 3), "runs/a/trace/rank-3.json");
  EXPECT_EQ(merged_trace_file("runs/a"), "runs/a/trace/trace.json");
  EXPECT_EQ(profile_file("runs/a", 12), "runs/a/profile/rank-12.json");
  EXPECT_EQ(tensorboard_dir("runs/a", ""), "runs/a/tb");
  EXPECT_EQ(mlflow_run_id_file("runs/a"), "runs/a/mlflow_run_id");
  EXPECT_EQ(lora_adapter_dir("runs/a"), "runs/a/lora_adapter");
  EXPECT_EQ(data_cache_dir("runs/a"), "runs/a/data_cache");
}

TEST(RunFiles, ConfiguredPathsWin) {
  EXPECT_EQ(metrics_file("runs/a", "/logs/m.jsonl"), "/logs/m.jsonl");
  EXPECT_EQ(tensorboard_dir("runs/a", "/tb/a"), "/tb/a");
}

TEST(RunFiles, RankFileNamesParseBackToTheirRank) {
  EXPECT_EQ(rank_of_file("rank-0.json"), 0);
  EXPECT_EQ(rank_of_file("rank-123456.json"), 123456);
  for (const char* other : {"rank-.json", "rank-1234567.json", "rank-x.json", "trace.json",
                            "rank-1.json.partial", "xrank-1.json"}) {
    EXPECT_EQ(rank_of_file(other), -1) << other;
  }
}

}  // namespace
}  // namespace dstrain::run_files
