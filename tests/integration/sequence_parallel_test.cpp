// Sequence parallelism end to end: `dstrain launch` of 2 and 4 real processes over Gloo, with
// parallel.sequence_parallel_size P, against N/P processes without it (one process when N = P). A
// group of P ranks trains on exactly the batches of one rank with the same micro batch, and every
// step's loss and gradient norm and the final eval loss must agree within 1e-5 relative in fp32:
// the data, the loss and every gradient (which the later losses depend on) are the same. ZeRO 0–3
// (with offload), accumulation, clipping, LoRA, activation checkpointing; bf16 within bf16's
// rounding. Then resuming a P = 2 checkpoint on one rank, the launcher's groups, and the
// configuration errors (exit 2 naming the keys).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

using ::testing::HasSubstr;

struct Case {
  std::string name;
  int world;
  int p;
  int stage;
  int accum;
  std::vector<std::string> extra;    // both runs
  std::vector<std::string> sp_only;  // the sequence-parallel run only
  double tol = 1e-5;
};

class SequenceParallelRun : public ::testing::TestWithParam<Case> {};

TEST_P(SequenceParallelRun, LossesEqualOneProcessWithTheSameBatches) {
  const Case c = GetParam();
  std::vector<std::string> with_sp = c.extra;
  with_sp.insert(with_sp.end(), c.sp_only.begin(), c.sp_only.end());
  with_sp.push_back("parallel.sequence_parallel_size=" + std::to_string(c.p));
  const Curves got = run_curves(c.world, c.stage, c.accum, with_sp);
  // The same run without sequence parallelism on the N/P data-parallel ranks (one process when
  // N = P): the same batches, and the same eval shards (eval_max_batches counts per rank).
  const Curves want = run_curves(c.world / c.p, 0, c.accum, c.extra);
  ASSERT_EQ(want.train.size(), 6u);
  expect_same_curve(got.train, want.train, c.tol, "train/loss");
  expect_same_curve(got.grad_norm, want.grad_norm, c.tol, "grad_norm");
  ASSERT_EQ(want.eval.size(), 1u);
  expect_same_curve(got.eval, want.eval, c.tol, "eval/loss");
  EXPECT_LT(got.train.rbegin()->second, got.train.begin()->second) << "it did not learn";
}

INSTANTIATE_TEST_SUITE_P(
    Ulysses, SequenceParallelRun,
    ::testing::Values(
        Case{"P2Stage0", 2, 2, 0, 1, {}, {}, 1e-5}, Case{"P2Stage1", 2, 2, 1, 1, {}, {}, 1e-5},
        Case{"P2Stage2Accum2", 2, 2, 2, 2, {}, {}, 1e-5},
        Case{"P2Stage3", 2, 2, 3, 1, {}, {}, 1e-5}, Case{"P4Stage2", 4, 4, 2, 1, {}, {}, 1e-5},
        Case{"P2World4Stage3Offload",
             4,
             2,
             3,
             1,
             {},
             {"zero.offload_optimizer.device=cpu", "zero.offload_param.device=cpu"},
             1e-5},
        Case{"P2LoraStage2",
             2,
             2,
             2,
             1,
             {"lora.enabled=true", "lora.dropout=0", "training.lr=1e-2"},
             {},
             1e-5},
        Case{"P2Checkpointing", 2, 2, 1, 1, {"model.gradient_checkpointing=true"}, {}, 1e-5},
        Case{"P2SelectiveCheckpointing",
             2,
             2,
             3,
             1,
             {"model.gradient_checkpointing=selective"},
             {},
             1e-5},
        Case{"P2Bf16", 2, 2, 2, 1, {"training.bf16=true"}, {}, 2e-2}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(SequenceParallelResume, P2CheckpointResumesOnOneRankOnTheSameCurve) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.max_steps = 6;
  spec.checkpoint_interval = 3;
  spec.extra_overrides = {"parallel.sequence_parallel_size=2"};
  RunResult r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto full = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  std::filesystem::remove(dir.file("run/metrics.jsonl"));
  r = run_dstrain({"resume", dir.file("ckpt/step_00000003"), "--nproc", "1", "--set",
                   "parallel.sequence_parallel_size=1"},
                  {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto resumed = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(resumed.size(), 3u);
  for (const auto& [step, loss] : resumed) {
    EXPECT_NEAR(loss, full.at(step), 1e-5 * std::abs(loss)) << "step " << step;
  }
}

TEST(SequenceParallelLaunch, DryRunShowsTheGroups) {
  TempDir dir;
  JobSpec spec;
  const std::string cfg = write_job_config(dir.path(), spec);
  const RunResult r = run_dstrain(
      {"launch", "--nproc", "4", "--dry-run", cfg, "--set", "parallel.sequence_parallel_size=2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("sequence-parallel groups of 2 consecutive ranks (data-parallel "
                               "size 2):\n  group 0: ranks 0-1 on node 0 (localhost)\n  group 1: "
                               "ranks 2-3 on node 0 (localhost)\n"));
}

TEST(SequenceParallelLaunch, WorldOrLengthNotDivisibleIsExit2NamingTheKeys) {
  TempDir dir;
  JobSpec spec;
  const std::string cfg = write_job_config(dir.path(), spec);
  RunResult r = run_dstrain(
      {"launch", "--nproc", "3", "--dry-run", cfg, "--set", "parallel.sequence_parallel_size=2"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("parallel.sequence_parallel_size"));
  EXPECT_THAT(r.err,
              HasSubstr("the world size (3) is not divisible by sequence_parallel_size (2)"));
  r = run_dstrain({"launch", "--nproc", "4", "--dry-run", cfg, "--set",
                   "parallel.sequence_parallel_size=4", "--set", "data.max_length=30"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("data.max_length (30"));
  EXPECT_THAT(r.err, HasSubstr("sequence_parallel_size (4)"));
}

// The tiny model with 6 query heads: a group of 4 ranks cannot share them. Every rank reads the
// model and stops with the config error; the launcher passes on exit 2.
TEST(SequenceParallelLaunch, HeadsNotDivisibleIsExit2NamingTheModelAndTheKey) {
  TempDir dir;
  std::string model =
      read_text(std::string(DSTRAIN_SOURCE_DIR) + "/configs/models/tiny/config.json");
  const std::string heads = "\"num_attention_heads\": 4";
  ASSERT_NE(model.find(heads), std::string::npos);
  model.replace(model.find(heads), heads.size(), "\"num_attention_heads\": 6");
  std::filesystem::create_directories(dir.file("model"));
  std::ofstream(dir.file("model/config.json")) << model;
  JobSpec spec;
  spec.max_steps = 1;
  const std::string cfg = write_job_config(dir.path(), spec);
  const RunResult r = launch_job(
      cfg, 4, {"model.name_or_path=" + dir.file("model"), "parallel.sequence_parallel_size=4"},
      120);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.out + r.err, HasSubstr("num_attention_heads (6) is not divisible by "
                                       "parallel.sequence_parallel_size (4)"));
}

}  // namespace
}  // namespace dstrain::testing
