// The seed configurations run as written on the tiny model: a DeepSpeed JSON (stage 2, CPU
// optimizer offload, bf16, WarmupCosineLR) named by `zero: {config: ...}`, and a YAML with a
// `deepspeed:` section (stage 3). Only the model, data and output paths are replaced, and the run
// is cut to 10 steps (20 for the JSON, whose
// warm-up alone is 10).

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

// The shared directory next to the checkout; DSTRAIN_SHARED_DIR names another one.
const std::string kSeeds =
    std::string(std::getenv("DSTRAIN_SHARED_DIR") ? std::getenv("DSTRAIN_SHARED_DIR")
                                                  : DSTRAIN_SOURCE_DIR "/../shared") +
    "/seed-configs";
const std::string kSource = DSTRAIN_SOURCE_DIR;

bool seeds_present() {
  return std::filesystem::exists(kSeeds + "/ds_config.json") &&
         std::filesystem::exists(kSeeds + "/train.yaml");
}

// Model and data replaced by the repository's tiny ones; outputs go to `dir`.
std::vector<std::string> tiny_overrides(const TempDir& dir, int max_steps) {
  return {"model.name_or_path=" + kSource + "/configs/models/tiny",
          "model.init=random",
          "model.tokenizer=byte",
          "data.train_path=" + kSource + "/configs/data/tiny_corpus.txt",
          "data.document=line",
          "data.max_length=64",
          "training.max_steps=" + std::to_string(max_steps),
          "training.log_interval=1",
          "logging.out_dir=" + dir.file("run"),
          "logging.metrics_path=" + dir.file("run/metrics.jsonl")};
}

void expect_completed_with_falling_loss(const TempDir& dir, const RunResult& r, int steps) {
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto loss = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(loss.size(), static_cast<size_t>(steps)) << r.out << r.err;
  EXPECT_LT(loss.at(steps), loss.at(1)) << r.out;
  const auto summary = nlohmann::json::parse(read_text(dir.file("run/summary.json")));
  EXPECT_EQ(summary["status"], "completed");
  EXPECT_EQ(summary["steps"], steps);
}

TEST(SeedConfigs, DeepSpeedJsonStage2CpuOffloadBf16WarmupCosineRuns) {
  if (!seeds_present()) GTEST_SKIP() << "no seed configs at " << kSeeds;
  TempDir dir;
  std::filesystem::copy_file(kSeeds + "/ds_config.json", dir.file("ds_config.json"));
  std::ofstream(dir.file("train.yaml"))
      << fmt::format("zero:\n  config: {}\n", dir.file("ds_config.json"));
  // WarmupCosineLR warms up for 10 steps and needs a longer run than that: 20 steps.
  std::vector<std::string> overrides = tiny_overrides(dir, 20);
  overrides.push_back("data.eval_split=0");
  const RunResult r = launch_job(dir.file("train.yaml"), 2, overrides);
  expect_completed_with_falling_loss(dir, r, 20);
}

TEST(SeedConfigs, TrainYamlWithDeepSpeedSectionStage3AndLoraRuns) {
  if (!seeds_present()) GTEST_SKIP() << "no seed configs at " << kSeeds;
  TempDir dir;
  std::filesystem::copy_file(kSeeds + "/train.yaml", dir.file("train.yaml"));
  std::vector<std::string> overrides = tiny_overrides(dir, 10);
  overrides.push_back("data.eval_path=" + kSource + "/configs/data/tiny_corpus.txt");
  // As written: ZeRO-3 with the file's LoRA section (r 16 on q/k/v/o_proj), except the learning
  // rate: at the file's 2e-5 ten LoRA steps (B starts at zero) move the loss less than the noise
  // between batches.
  overrides.push_back("training.lr=5e-3");
  const RunResult r = launch_job(dir.file("train.yaml"), 2, overrides);
  expect_completed_with_falling_loss(dir, r, 10);
  EXPECT_TRUE(std::filesystem::exists(dir.file("run/lora_adapter/adapter_config.json")));
  EXPECT_NE(r.out.find("LoRA r=16"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dstrain::testing
