// training.per_device_train_batch_size: auto end to end, real `dstrain` processes on the tiny model
// (packing on, so every sample counts max_length tokens): the losses of the user's own split within
// the fp32 rule (1e-5 relative, as train_equivalence_test), the choice printed and recorded in the
// checkpoint's config.yaml, two Gloo ranks following rank 0, the choice kept on resume at the same
// world and made again at another with the same global batch, the DeepSpeed hint, and bad values
// exiting 2.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include <fmt/format.h>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kAuto = "training.per_device_train_batch_size=auto";

// The user's split: micro-batch 1 × accumulation 4 per rank, 8 steps, a checkpoint every 4.
JobSpec users_split(int nproc, int stage = 0) {
  JobSpec spec;
  spec.nproc = nproc;
  spec.stage = stage;
  // Stage 3: the tiny model's matrices are below the default threshold; shard them for real.
  if (stage == 3) spec.extra_overrides = {"zero.stage3_param_persistence_threshold=1000"};
  spec.micro = 1;
  spec.accum = 4;
  spec.max_steps = 8;
  spec.checkpoint_interval = 4;
  spec.save_final = true;
  return spec;
}

std::map<long, double> losses(const TempDir& dir) {
  return read_metric(dir.file("run/metrics.jsonl"), "train/loss");
}

void expect_fp32_equal(const std::map<long, double>& got, const std::map<long, double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [step, loss] : want) {
    ASSERT_EQ(got.count(step), 1u) << "step " << step;
    EXPECT_NEAR(got.at(step), loss, 1e-5 * std::abs(loss)) << "step " << step;
  }
}

// Runs the user's split and the same config with auto on `nproc` ranks; checks the losses, the
// line and the record. Leaves the auto run's directory in *auto_dir.
void expect_auto_matches_users_split(int nproc, TempDir& auto_dir, int stage = 0) {
  TempDir users;
  const RunResult mine = run_job(users, users_split(nproc, stage));
  ASSERT_EQ(mine.exit_code, 0) << mine.out << mine.err;
  EXPECT_THAT(mine.out + mine.err, Not(HasSubstr("micro-batch auto")));

  const RunResult r = run_job(auto_dir, users_split(nproc, stage), {kAuto});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // The CPU's limit (host MemAvailable) holds the tiny model's whole per-rank batch.
  EXPECT_THAT(r.out + r.err,
              HasSubstr(fmt::format("micro-batch auto: 4 × accumulation 1 = global {}, fits in ",
                                    4 * nproc)));
  expect_fp32_equal(losses(auto_dir), losses(users));
  const std::string record = read_text(auto_dir.file("ckpt/step_00000008/config.yaml"));
  EXPECT_THAT(record, HasSubstr("per_device_train_batch_size: \"auto\"  # chosen: micro-batch 4 "
                                "x accumulation 1\n"));
  EXPECT_THAT(record, HasSubstr("gradient_accumulation_steps: 4\n"));
  EXPECT_THAT(record, HasSubstr(fmt::format("train_batch_size: {}\n", 4 * nproc)));
}

TEST(MicroBatchAuto, OneRankLogsTheUsersSplitsLossesAndRecordsTheChoice) {
  TempDir dir;
  expect_auto_matches_users_split(1, dir);
}

TEST(MicroBatchAuto, TwoRanksFollowRankZeroAndResumeKeepsOrRemakesTheChoice) {
  TempDir dir;
  ASSERT_NO_FATAL_FAILURE(expect_auto_matches_users_split(2, dir));
  const std::map<long, double> full = losses(dir);
  std::filesystem::rename(dir.file("run/metrics.jsonl"), dir.file("full.jsonl"));

  // Same world: the recorded micro-batch, no new choice, the very same steps.
  RunResult r = run_dstrain({"resume", dir.file("ckpt/step_00000004")}, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(
      r.out + r.err,
      HasSubstr("micro-batch auto: 4 × accumulation 1 = global 8, kept from the checkpoint"));
  const std::map<long, double> kept = losses(dir);
  ASSERT_EQ(kept.size(), 4u);
  expect_same_losses_after(4, kept, full);
  std::filesystem::remove(dir.file("run/metrics.jsonl"));

  // One rank: chosen again for 8 samples per rank, the global batch of 8 kept.
  r = run_dstrain({"resume", dir.file("ckpt/step_00000004"), "--nproc", "1", "--set",
                   "checkpoint.interval=0", "--set", "checkpoint.save_final=false"},
                  {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out + r.err,
              HasSubstr("micro-batch auto: 8 × accumulation 1 = global 8, fits in "));
  const std::map<long, double> one = losses(dir);
  ASSERT_EQ(one.size(), 4u);
  for (const auto& [step, loss] : one) {
    EXPECT_NEAR(loss, full.at(step), 1e-5 * std::abs(full.at(step))) << "step " << step;
  }
}

// The trial's backward communicates at stages 2 (reduce-scatter) and 3 (gathers too): it must
// still leave nothing behind.
TEST(MicroBatchAuto, TheTrialLeavesNoTraceAtStagesTwoAndThree) {
  for (int stage : {2, 3}) {
    SCOPED_TRACE(fmt::format("stage {}", stage));
    TempDir dir;
    expect_auto_matches_users_split(2, dir, stage);
  }
}

// A pipeline plans its fullest stage (its blocks, its schedule's micro-batches in flight) and its
// trial is a step through the stages: the choice trains the user's split's losses.
TEST(MicroBatchAuto, APipelinePlansItsStagesAndTrainsTheUsersSplitsLosses) {
  JobSpec spec = users_split(2, 1);
  spec.extra_overrides = {"parallel.pipeline_parallel_size=2"};
  TempDir users, chosen;
  const RunResult mine = run_job(users, spec);
  ASSERT_EQ(mine.exit_code, 0) << mine.out << mine.err;
  const RunResult r = run_job(chosen, spec, {kAuto});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // One pipeline: its 4 samples a step in one micro-batch, the tiny model fitting the host.
  EXPECT_THAT(r.out + r.err,
              HasSubstr("micro-batch auto: 4 × accumulation 1 = global 4, fits in "));
  expect_fp32_equal(losses(chosen), losses(users));
}

TEST(MicroBatchAuto, DeepSpeedMicroBatchOneGetsTheHint) {
  TempDir dir;
  JobSpec spec;
  spec.max_steps = 1;
  const RunResult r = run_job(
      dir, spec,
      {"deepspeed.train_micro_batch_size_per_gpu=1", "deepspeed.gradient_accumulation_steps=4"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out + r.err,
              HasSubstr("deepspeed.train_micro_batch_size_per_gpu: hint: micro-batch 1 with "
                        "gradient accumulation 4 runs one sample at a time; "
                        "training.per_device_train_batch_size: auto keeps the global batch"));
  EXPECT_THAT(r.out + r.err, HasSubstr("(see docs/training.md, Micro-batch auto)"));
}

TEST(MicroBatchAuto, BadValuesExitTwoNamingTheKey) {
  TempDir dir;
  JobSpec spec;
  RunResult r = run_job(dir, spec, {"training.per_device_train_batch_size=autox"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("training.per_device_train_batch_size: expected a positive integer "
                               "or auto, got \"autox\""));
  spec.nproc = 2;
  r = run_job(dir, spec, {kAuto, "training.train_batch_size=3"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("training.train_batch_size: 3 is not divisible by world size (2): "
                               "per_device_train_batch_size: auto"));
}

}  // namespace
}  // namespace dstrain::testing
