// The trainer's cadence on an injected in-memory communicator (no processes, no rendezvous):
// eval every eval_interval steps and at the end, checkpoints every checkpoint.interval steps and
// at the end, a stop request (SIGUSR1) saving and stopping a step later, a resume
// continuing bit for bit, and two ranks (threads) committing a checkpoint together.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ckpt/layout.h"
#include "ckpt/manifest.h"
#include "config/config.h"
#include "tests/common/temp_dir.h"
#include "tests/common/thread_communicator.h"
#include "train/trainer.h"

namespace dstrain::train {
namespace {
namespace stdfs = std::filesystem;
using nlohmann::json;

config::Config tiny_config(const stdfs::path& dir, int64_t steps, int64_t eval_interval,
                           int64_t ckpt_interval, int world = 1) {
  const std::string src = DSTRAIN_SOURCE_DIR;
  const std::string yaml = fmt::format(
      "model: {{name_or_path: {src}/configs/models/tiny, init: random, tokenizer: byte}}\n"
      "data: {{train_path: {src}/configs/data/tiny_corpus.txt, document: line, max_length: 32,\n"
      "       eval_split: 0.05}}\n"
      "training: {{max_steps: {steps}, per_device_train_batch_size: 2, lr: 3.0e-3, seed: 5,\n"
      "           log_interval: 1, eval_interval: {eval}, eval_max_batches: 1}}\n"
      "zero: {{stage: 2}}\n"
      "logging: {{out_dir: {dir}/run, progress: false, tensorboard: false}}\n"
      "checkpoint: {{dir: {dir}/ckpt, interval: {ckpt}}}\n",
      fmt::arg("src", src), fmt::arg("steps", steps), fmt::arg("eval", eval_interval),
      fmt::arg("dir", dir.string()), fmt::arg("ckpt", ckpt_interval));
  config::LoadOptions lo;
  lo.world_size = world;
  return config::load_config_from_string(yaml, "cadence.yaml", lo);
}

// Runs one trainer per rank, each on its own thread with an in-memory communicator.
std::vector<RunSummary> train(const config::Config& cfg, const std::string& resume_from = "",
                              int world = 1) {
  std::vector<RunSummary> out(world);
  testing::run_ranks(world, [&](testing::ThreadCommunicator& c) {
    World w;
    w.rank = c.rank();
    w.size = world;
    w.comm = std::make_unique<testing::BorrowedCommunicator>(c);
    out[c.rank()] = Trainer(cfg, resume_from, std::move(w)).run();
  });
  return out;
}

// step → the record's keys, from metrics.jsonl.
std::map<int64_t, json> metrics_by_step(const stdfs::path& run_dir) {
  std::map<int64_t, json> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line);
    out[j.at("step").get<int64_t>()].update(j);
  }
  return out;
}

std::set<std::string> tags(const stdfs::path& ckpt_dir) {
  const auto v = ckpt::list_complete_tags(ckpt_dir.string());
  return {v.begin(), v.end()};
}

TEST(TrainerCadence, EvalAndCheckpointsAtTheirIntervalsAndAtTheEnd) {
  dstrain::testing::TempDir dir;
  const RunSummary s = train(tiny_config(dir.path(), 7, 3, 3))[0];
  EXPECT_EQ(s.steps, 7);
  EXPECT_FALSE(s.preempted);
  std::set<int64_t> evals;
  for (const auto& [step, rec] : metrics_by_step(dir.path() / "run")) {
    if (rec.contains("eval/loss")) evals.insert(step);
  }
  EXPECT_EQ(evals, (std::set<int64_t>{3, 6, 7}));
  EXPECT_EQ(
      tags(dir.path() / "ckpt"),
      (std::set<std::string>{ckpt::tag_for_step(3), ckpt::tag_for_step(6), ckpt::tag_for_step(7)}));
  EXPECT_EQ(ckpt::read_latest((dir.path() / "ckpt").string()), ckpt::tag_for_step(7));
  EXPECT_EQ(s.checkpoint, (dir.path() / "ckpt" / ckpt::tag_for_step(7)).string());
}

TEST(TrainerCadence, StopRequestSavesAStepLaterAndStops) {
  dstrain::testing::TempDir dir;
  RankLifetime::stop_requested().store(true);
  const RunSummary s = train(tiny_config(dir.path(), 50, 0, 0))[0];
  RankLifetime::stop_requested().store(false);
  EXPECT_TRUE(s.preempted);
  // The vote taken after step 1 is read after step 2 (train/step_sync.h).
  EXPECT_EQ(s.steps, 2);
  EXPECT_EQ(ckpt::read_latest((dir.path() / "ckpt").string()), ckpt::tag_for_step(2));
  const json summary = json::parse(std::ifstream(dir.path() / "run/summary.json"));
  EXPECT_EQ(summary.at("status"), "preempted");
}

TEST(TrainerCadence, ResumeContinuesBitForBit) {
  dstrain::testing::TempDir dir;
  const config::Config cfg = tiny_config(dir.path(), 6, 0, 3);
  train(cfg);
  const auto full = metrics_by_step(dir.path() / "run");
  stdfs::rename(dir.path() / "run/metrics.jsonl", dir.path() / "run/full.jsonl");
  const RunSummary s = train(cfg, (dir.path() / "ckpt" / ckpt::tag_for_step(3)).string())[0];
  EXPECT_EQ(s.steps, 6);
  const auto resumed = metrics_by_step(dir.path() / "run");
  for (int64_t step = 4; step <= 6; ++step) {
    ASSERT_TRUE(resumed.count(step)) << step;
    EXPECT_EQ(resumed.at(step).at("train/loss").get<double>(),
              full.at(step).at("train/loss").get<double>())
        << "step " << step;
  }
  EXPECT_EQ(resumed.count(3), 0u);
}

TEST(TrainerCadence, TwoRanksCommitOneCheckpoint) {
  dstrain::testing::TempDir dir;
  const auto s = train(tiny_config(dir.path(), 4, 0, 2, 2), "", 2);
  EXPECT_EQ(s[0].steps, 4);
  EXPECT_EQ(s[1].steps, 4);
  const std::string tag_dir = (dir.path() / "ckpt" / ckpt::tag_for_step(4)).string();
  const ckpt::Manifest m = ckpt::read_manifest(tag_dir);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.files.at(1).name, ckpt::shard_file_name(1));
  for (const char* name : {"engine", "loss_scaler", "loader", "progress"}) {
    EXPECT_NE(m.component(name), nullptr) << name;
  }
}

}  // namespace
}  // namespace dstrain::train
