// ZeRO stages 0–3 at world sizes 1–3 against a single-process run of the same global batch:
// the per-step losses must agree within 1e-5 relative (fp32), with and without gradient
// accumulation and clipping. The data sampler gives every optimizer step the same set of samples
// for any world size with the same global batch, so a single process with accumulation = world ×
// accumulation sees exactly the multi-rank run's data.

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <tuple>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

struct Case {
  int stage;
  int world;
  int accum;
  double clip;
  bool offload = false;  // stage 3: optimizer and parameter shards offloaded to the host
};

std::map<long, double> run_losses(const JobSpec& spec, TempDir& dir) {
  const std::string cfg = write_job_config(dir.path(), spec);
  const RunResult r = launch_job(cfg, spec.nproc, spec.extra_overrides);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return read_metric(dir.file("run/metrics.jsonl"), "train/loss");
}

// Single-process stage-0 references, one per (global accumulation, clip).
const std::map<long, double>& reference(int accum, double clip) {
  static std::map<std::pair<int, double>, std::map<long, double>> cache;
  auto key = std::make_pair(accum, clip);
  auto it = cache.find(key);
  if (it == cache.end()) {
    TempDir dir;
    JobSpec spec;
    spec.accum = accum;
    spec.clip = clip;
    it = cache.emplace(key, run_losses(spec, dir)).first;
  }
  return it->second;
}

class StageEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(StageEquivalence, LossesMatchSingleProcessWithin1e5) {
  const Case c = GetParam();
  TempDir dir;
  JobSpec spec;
  spec.nproc = c.world;
  spec.stage = c.stage;
  spec.accum = c.accum;
  spec.clip = c.clip;
  if (c.stage == 3) {
    // The tiny model's matrices are all below the default threshold: shard them for real.
    spec.extra_overrides.push_back("zero.stage3_param_persistence_threshold=1000");
  }
  if (c.offload) {
    spec.extra_overrides.push_back("zero.offload_optimizer.device=cpu");
    spec.extra_overrides.push_back("zero.offload_param.device=cpu");
  }
  const auto got = run_losses(spec, dir);
  const auto& want = reference(c.accum * c.world, c.clip);
  ASSERT_EQ(got.size(), 20u);
  ASSERT_EQ(want.size(), 20u);
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << "step " << step;
    EXPECT_NEAR(got.at(step), loss, 1e-5 * std::abs(loss)) << "step " << step;
  }
  // The run must actually learn, or matching would prove little.
  EXPECT_LT(got.rbegin()->second, got.begin()->second - 0.5);
}

INSTANTIATE_TEST_SUITE_P(
    Zero, StageEquivalence,
    ::testing::Values(Case{0, 2, 1, 0.0}, Case{1, 2, 1, 0.0}, Case{2, 2, 1, 0.0},
                      Case{2, 1, 2, 1.0}, Case{0, 3, 1, 1.0}, Case{1, 3, 2, 1.0},
                      Case{2, 3, 2, 1.0}, Case{2, 2, 2, 0.0}, Case{3, 2, 1, 0.0},
                      Case{3, 3, 2, 1.0}, Case{3, 2, 2, 1.0, true}),
    [](const ::testing::TestParamInfo<Case>& i) {
      return "Stage" + std::to_string(i.param.stage) + "World" + std::to_string(i.param.world) +
             "Accum" + std::to_string(i.param.accum) + (i.param.clip > 0 ? "Clip" : "NoClip") +
             (i.param.offload ? "Offload" : "");
    });

// model.fused_loss changes how the head's loss is computed, not what: the same steps with and
// without it give the same losses. Stage 0 on one rank, and stage 3 on two ranks, where the head
// weight (the tiny model's tied embedding) is gathered for the head segment and released after it.
class FusedLoss : public ::testing::TestWithParam<Case> {};

TEST_P(FusedLoss, LossesMatchTheUnfusedPathWithin1e6) {
  const Case c = GetParam();
  std::map<bool, std::map<long, double>> train, eval;
  for (bool fused : {false, true}) {
    TempDir dir;
    JobSpec spec;
    spec.nproc = c.world;
    spec.stage = c.stage;
    spec.accum = c.accum;
    spec.max_steps = 8;
    spec.extra_overrides = {"model.fused_loss=" + std::string(fused ? "true" : "false"),
                            "training.eval_interval=4",
                            "zero.stage3_param_persistence_threshold=1000"};
    const RunResult r =
        launch_job(write_job_config(dir.path(), spec), spec.nproc, spec.extra_overrides);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    train[fused] = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
    eval[fused] = read_metric(dir.file("run/metrics.jsonl"), "eval/loss");
  }
  ASSERT_EQ(train[true].size(), 8u);
  ASSERT_EQ(train[false].size(), 8u);
  for (const auto& [step, loss] : train[false]) {
    EXPECT_NEAR(train[true].at(step), loss, 1e-6 * std::abs(loss)) << "step " << step;
  }
  ASSERT_EQ(eval[true].size(), 2u);
  ASSERT_EQ(eval[false].size(), 2u);
  for (const auto& [step, loss] : eval[false]) {
    EXPECT_NEAR(eval[true].at(step), loss, 1e-6 * std::abs(loss)) << "eval at step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Loss, FusedLoss, ::testing::Values(Case{0, 1, 2, 0.0}, Case{3, 2, 1, 0.0}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "Stage" + std::to_string(i.param.stage) + "World" +
                                  std::to_string(i.param.world);
                         });

// The long-sequence memory settings change what is kept between forward and backward, not what
// is computed: tiled MLP (7-token tiles, which do not divide the micro-batch), offloaded
// checkpoints and 1 MiB loss chunks give the losses of plain training, at stage 0 on one rank and
// at stages 2 and 3 on two (stage 3 regathers each layer's weights for its backward, where the
// tiles are recomputed).
class LongSequenceSettings : public ::testing::TestWithParam<Case> {};

// The losses of plain training and of training with `lean_settings` added agree within 1e-5.
void expect_plain_losses(const Case& c, const std::vector<std::string>& lean_settings) {
  std::map<bool, std::map<long, double>> train;
  for (bool lean : {false, true}) {
    TempDir dir;
    JobSpec spec;
    spec.nproc = c.world;
    spec.stage = c.stage;
    spec.max_steps = 6;
    spec.extra_overrides = {"zero.stage3_param_persistence_threshold=1000"};
    if (lean) {
      spec.extra_overrides.insert(spec.extra_overrides.end(), lean_settings.begin(),
                                  lean_settings.end());
    }
    const RunResult r =
        launch_job(write_job_config(dir.path(), spec), spec.nproc, spec.extra_overrides);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    train[lean] = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  }
  ASSERT_EQ(train[false].size(), 6u);
  ASSERT_EQ(train[true].size(), 6u);
  for (const auto& [step, loss] : train[false]) {
    EXPECT_NEAR(train[true].at(step), loss, 1e-5 * std::abs(loss)) << "step " << step;
  }
}

TEST_P(LongSequenceSettings, LossesMatchPlainTrainingWithin1e5) {
  expect_plain_losses(GetParam(), {"model.gradient_checkpointing=offload", "model.tiled_mlp=7",
                                   "model.fused_loss_chunk_mb=1"});
}

// Selective checkpointing (attention kept, the rest recomputed) with tiled MLP.
TEST_P(LongSequenceSettings, SelectiveCheckpointingLossesMatchPlainTrainingWithin1e5) {
  expect_plain_losses(GetParam(), {"model.gradient_checkpointing=selective", "model.tiled_mlp=7"});
}

INSTANTIATE_TEST_SUITE_P(Memory, LongSequenceSettings,
                         ::testing::Values(Case{0, 1, 1, 0.0}, Case{2, 2, 1, 0.0},
                                           Case{3, 2, 1, 0.0}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "Stage" + std::to_string(i.param.stage) + "World" +
                                  std::to_string(i.param.world);
                         });

}  // namespace
}  // namespace dstrain::testing
