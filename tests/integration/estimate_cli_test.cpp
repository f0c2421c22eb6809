// `dstrain estimate` as a user runs it: the table for the config's model on nodes × GPUs ranks,
// and bad input as exit code 2.

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

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
  // Below, the activations of one micro-batch per checkpointing setting (tiny.yaml: 8 x 128).
  EXPECT_NE(r.out.find("Activations per rank: micro-batch 8 x 128 tokens (1024 tokens)"),
            std::string::npos)
      << r.out;
  for (const char* setting : {"\nfalse ", "\nselective ", "\ntrue ", "\noffload "})
    EXPECT_NE(r.out.find(setting), std::string::npos) << setting << r.out;
}

// With per_device_train_batch_size: auto the table is for micro-batch 1, and a note says so.
TEST(EstimateCli, AutoMicroBatchNotesThatTheActivationsAreForMicroBatchOne) {
  const RunResult r = run_dstrain(
      {"estimate", kTiny, "--set", "model.name_or_path=" DSTRAIN_SOURCE_DIR "/configs/models/tiny",
       "--set", "training.per_device_train_batch_size=auto"},
      {}, 30);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Activations per rank: micro-batch 1 x 128 tokens"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("Note: training.per_device_train_batch_size is auto: the activations above "
                       "are per micro-batch of 1; the run picks the largest micro-batch of its 8 "
                       "samples per rank"),
            std::string::npos)
      << r.out;
  const RunResult fixed = run_dstrain(
      {"estimate", kTiny, "--set", "model.name_or_path=" DSTRAIN_SOURCE_DIR "/configs/models/tiny"},
      {}, 30);
  EXPECT_EQ(fixed.out.find("Note: training.per_device_train_batch_size is auto"), std::string::npos)
      << fixed.out;
}

TEST(EstimateCli, JsonHasTheActivationsPerSetting) {
  const RunResult r = run_dstrain({"estimate", kTiny, "--json", "--set",
                                   "model.name_or_path=" DSTRAIN_SOURCE_DIR "/configs/models/tiny"},
                                  {}, 30);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["activations"]["rows"].size(), 4u) << r.out;
  EXPECT_EQ(j["activations"]["rows"][1]["gradient_checkpointing"], "selective") << r.out;
  EXPECT_GT(j["activations"]["layer_attention"].get<int64_t>(), 0) << r.out;
  EXPECT_EQ(j["activations"]["tokens"], 1024);
  int64_t previous = INT64_MAX;
  for (const auto& row : j["activations"]["rows"]) {
    EXPECT_LE(row["device"].get<int64_t>(), previous) << "each setting keeps less: " << r.out;
    previous = row["device"].get<int64_t>();
  }
}

// With pipeline parallelism each pipeline rank is printed: its blocks' parameters (the two add up
// to the model's), and what its schedule keeps in flight (GPipe: every micro-batch).
TEST(EstimateCli, APipelinePrintsEachRanksStages) {
  const std::vector<std::string> args = {
      "estimate", kTiny,
      "--gpus",   "2",
      "--set",    "model.name_or_path=" DSTRAIN_SOURCE_DIR "/configs/models/tiny",
      "--set",    "parallel.pipeline_parallel_size=2",
      "--set",    "parallel.pipeline_schedule=gpipe",
      "--set",    "training.gradient_accumulation_steps=4"};
  const RunResult r = run_dstrain(args, {}, 30);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Pipeline rank 0 of 2 (blocks 0-"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Pipeline rank 1 of 2 (blocks "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 micro-batch chunk(s) in flight at its fullest"), std::string::npos)
      << r.out;
  std::vector<std::string> json = args;
  json.push_back("--json");
  const RunResult j = run_dstrain(json, {}, 30);
  ASSERT_EQ(j.exit_code, 0) << j.out << j.err;
  const auto out = nlohmann::json::parse(j.out);
  ASSERT_EQ(out["pipeline_stages"].size(), 2u) << j.out;
  int64_t params = 0;
  for (const auto& stage : out["pipeline_stages"]) {
    EXPECT_EQ(stage["in_flight"], 4) << j.out;
    params += stage["parameters"].get<int64_t>();
  }
  EXPECT_EQ(params, 1017216) << "the stages hold the model's parameters once";
}

// A Mixture-of-Experts model: its total and active parameters (text and JSON).
TEST(EstimateCli, AMixtureOfExpertsModelSaysItsActiveParameters) {
  TempDir dir;
  std::ifstream in(DSTRAIN_SOURCE_DIR "/configs/models/tiny/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config.update({{"model_type", "qwen3_moe"},
                 {"num_experts", 4},
                 {"num_experts_per_tok", 2},
                 {"moe_intermediate_size", 64},
                 {"head_dim", 32}});
  std::filesystem::create_directories(dir.file("model"));
  std::ofstream(dir.file("model/config.json")) << config.dump(2);
  RunResult r = run_dstrain(
      {"estimate", kTiny, "--json", "--set", "model.name_or_path=" + dir.file("model")}, {}, 30);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const int64_t total = j.at("parameters").get<int64_t>();
  const int64_t active = j.at("active_parameters").get<int64_t>();
  // 4 MoE layers, each 2 of its 4 experts (3 matrices of 128 x 64) idle for a token.
  EXPECT_EQ(total - active, 4 * 2 * 3 * 128 * 64);
  r = run_dstrain({"estimate", kTiny, "--set", "model.name_or_path=" + dir.file("model")}, {}, 30);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Mixture-of-Experts: " + std::to_string(total) + " parameters, " +
                       std::to_string(active) + " of them active for a token (2 of the 4 experts"),
            std::string::npos)
      << r.out;
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
