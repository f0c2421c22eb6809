// Tensor parallelism end to end: `dstrain launch` of 2 and 4 real processes over Gloo with
// parallel.tensor_parallel_size T, against N/T processes without it (one process when N = T). A
// tensor-parallel group trains on exactly the batches of one rank, so each of 20 steps' loss and
// gradient norm (clipping on) and the final eval loss must agree; in fp32 within 1e-5 relative
// (the measured difference is about 2e-7: the group's partial products are summed in another
// order), bf16 within bf16's rounding. T = 2 and 4, with and without the region's sequence
// parallelism, T2 × DP2 at ZeRO 1, 2 and 3, T2 × sequence parallelism 2, accumulation,
// activation checkpointing, tiled MLP, and the families (Mistral with a window shorter than the
// sequence, Qwen2 with biases and tied embeddings, Qwen3 with q/k norms). Then the launcher's
// groups and the configuration errors (exit 2 naming the key).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "tests/integration/parallel_runs.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

using ::testing::HasSubstr;

// Tensor by tensor within `tol` of the largest value.
void expect_same_tensors(const std::map<std::string, torch::Tensor>& got,
                         const std::map<std::string, torch::Tensor>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, b] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const torch::Tensor& a = got.at(name);
    ASSERT_EQ(a.sizes(), b.sizes()) << name;
    const double scale = std::max(1e-3, b.abs().max().item<double>());
    EXPECT_LT((a - b).abs().max().item<double>(), tol * scale) << name;
  }
}

struct Case {
  std::string name;
  int world;
  int t;
  int stage;
  int accum;
  std::vector<std::string> extra;    // both runs
  std::vector<std::string> tp_only;  // the tensor-parallel run only
  nlohmann::json model;              // changes to the tiny model's config.json
  double tol = 1e-5;
};

class TensorParallelRun : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelRun, LossesEqualOneRankWithTheSameBatches) {
  const Case c = GetParam();
  const TempDir models;
  std::vector<std::string> extra = c.extra;
  if (!c.model.is_null()) extra.push_back(write_model(models, c.model));
  std::vector<std::string> with_tp = extra;
  with_tp.insert(with_tp.end(), c.tp_only.begin(), c.tp_only.end());
  with_tp.push_back("parallel.tensor_parallel_size=" + std::to_string(c.t));
  const RunOutput got = run(c.world, c.stage, c.accum, with_tp);
  // The same run on the N/T data-parallel ranks without tensor parallelism: the same batches.
  const RunOutput want = run(c.world / c.t, c.stage, c.accum, extra);
  ASSERT_EQ(want.curves.train.size(), static_cast<size_t>(kSteps));
  expect_same_curve(got.curves.train, want.curves.train, c.tol, "train/loss");
  expect_same_curve(got.curves.grad_norm, want.curves.grad_norm, c.tol, "grad_norm");
  ASSERT_EQ(want.curves.eval.size(), 1u);
  expect_same_curve(got.curves.eval, want.curves.eval, c.tol, "eval/loss");
  EXPECT_LT(got.curves.train.rbegin()->second, got.curves.train.begin()->second)
      << "it did not learn";
  // A LoRA run's adapter, gathered whole from the slices: the same tensors.
  expect_same_tensors(got.adapter, want.adapter, 10 * c.tol);
}

// Four key/value heads and a vocabulary of 260: T = 4 divides every count.
const nlohmann::json kFourWay = {{"num_key_value_heads", 4}, {"vocab_size", 260}};
const std::string kNoRegionSp = "parallel.tensor_sequence_parallel=false";
const nlohmann::json kGqaEightFour = {
    {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"head_dim", 16}, {"vocab_size", 260}};
// LoRA on every projection (column- and row-parallel ones) with dropout: one rank's masks.
const std::vector<std::string> kLora = {"lora.enabled=true", "lora.target_modules=[all-linear]",
                                        "lora.dropout=0.1", "training.lr=1e-2"};

INSTANTIATE_TEST_SUITE_P(
    Megatron, TensorParallelRun,
    ::testing::Values(
        Case{"T2Stage0", 2, 2, 0, 1, {}, {}, nullptr},
        Case{"T2Stage0NoRegionSequenceParallel", 2, 2, 0, 1, {}, {kNoRegionSp}, nullptr},
        Case{"T4Stage2Accum2", 4, 4, 2, 2, {}, {}, kFourWay},
        Case{"T4Stage0NoRegionSequenceParallel", 4, 4, 0, 1, {}, {kNoRegionSp}, kFourWay},
        Case{"T2Dp2Stage1", 4, 2, 1, 1, {}, {}, nullptr},
        Case{"T2Dp2Stage2", 4, 2, 2, 1, {}, {}, nullptr},
        Case{"T2Dp2Stage2Accum2", 4, 2, 2, 2, {}, {}, nullptr},
        Case{"T2Dp2Stage3", 4, 2, 3, 1, {}, {}, nullptr},
        Case{"T2Sp2", 4, 2, 2, 1, {"parallel.sequence_parallel_size=2"}, {}, kFourWay},
        // Grouped-query attention: each rank 2 query heads sharing its 1 key/value head (T = 4),
        // and 4 query heads sharing 1 (T = 2).
        Case{"T4Gqa8q4kv", 4, 4, 1, 1, {}, {}, kGqaEightFour},
        Case{"T2Gqa8q2kv",
             2,
             2,
             1,
             1,
             {},
             {},
             {{"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"head_dim", 16}}},
        Case{"T2Checkpointing", 2, 2, 3, 1, {"model.gradient_checkpointing=true"}, {}, nullptr},
        Case{"T2SelectiveCheckpointing",
             2,
             2,
             2,
             1,
             {"model.gradient_checkpointing=selective"},
             {},
             nullptr},
        Case{"T2TiledMlp", 2, 2, 2, 1, {"model.tiled_mlp=8"}, {}, nullptr},
        Case{"T2MistralWindow",
             2,
             2,
             2,
             1,
             {},
             {},
             {{"model_type", "mistral"}, {"sliding_window", 12}}},
        Case{"T2Qwen2BiasesTied", 2, 2, 1, 1, {}, {}, {{"model_type", "qwen2"}}},
        Case{"T2Qwen3QkNormsUntied",
             2,
             2,
             3,
             1,
             {},
             {},
             {{"model_type", "qwen3"}, {"tie_word_embeddings", false}}},
        Case{"T2LoraStage3Dropout", 2, 2, 3, 1, kLora, {}, nullptr},
        // Adam's first steps amplify the rounding of the tensor-parallel sums in the adapters'
        // smallest gradients (steps 1-6 agree within 1e-5: the same masks). The losses agree
        // within 4e-7 at every step; the gradient norms of steps 7 and 13, where the norm jumps,
        // by 2.1e-5 and 6.5e-5 (1.5e-5 and 4.9e-5 when the partial gradients were summed at
        // every micro-step instead of once a step: the same steps, the same signs).
        Case{"T2Dp2LoraStage2", 4, 2, 2, 1, kLora, {}, nullptr, 1e-4},
        Case{"T2Bf16", 2, 2, 2, 1, {"training.bf16=true"}, {}, nullptr, 2e-2}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// A T2 x DP2 checkpoint (stage 2, global batch 8: micro 2 x accumulation 2 x 2) resumed as T1 x
// DP4, T4 and on one rank with the same global batch: the uninterrupted run's losses. The
// checkpoint holds the whole parameters (column pieces for the row-parallel weights): its export
// is the model of the same run without tensor parallelism.
TEST(TensorParallelResume, T2Dp2CheckpointResumesAsT1Dp4T4AndOneRank) {
  TempDir dir;
  const std::string model = write_model(dir, kFourWay);
  JobSpec spec;
  spec.nproc = 4;
  spec.stage = 2;
  spec.accum = 2;
  spec.clip = 1.0;
  spec.max_steps = 6;
  spec.checkpoint_interval = 3;
  spec.extra_overrides = {model, "parallel.tensor_parallel_size=2"};
  RunResult r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto full = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(full.size(), 6u);
  struct Layout {
    std::string name;
    int nproc, t, accum;
  };
  for (const Layout& l :
       {Layout{"T1xDP4", 4, 1, 1}, Layout{"T4", 4, 4, 4}, Layout{"1 rank", 1, 1, 4}}) {
    const std::string out =
        dir.file("resumed-" + std::to_string(l.nproc) + "-" + std::to_string(l.t));
    const auto resumed =
        resume_losses(dir.file("ckpt/step_00000003"), l.nproc,
                      {"parallel.tensor_parallel_size=" + std::to_string(l.t),
                       "training.gradient_accumulation_steps=" + std::to_string(l.accum)},
                      out, l.name);
    ASSERT_EQ(resumed.size(), 3u) << l.name;
    for (const auto& [step, loss] : resumed) {
      EXPECT_NEAR(loss, full.at(step), 1e-5 * std::abs(loss)) << l.name << " step " << step;
    }
  }
  // The same run without tensor parallelism (2 ranks: the same global batch): its step-3 export
  // and the tensor-parallel one hold the same model, tensor by tensor.
  TempDir plain;
  spec.nproc = 2;
  spec.extra_overrides = {model};
  r = run_job(plain, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_same_exports(dir.file("ckpt/step_00000003"), plain.file("ckpt/step_00000003"), plain);
}

TEST(TensorParallelFailure, AKilledRankOfAGroupTearsTheJobDownAndIsNamed) {
  JobSpec spec;
  spec.nproc = 4;
  spec.max_steps = 100000;
  spec.checkpoint_interval = 2;
  spec.extra_overrides = {"parallel.tensor_parallel_size=2"};
  const RankHit hit = hit_rank(spec, 1, SIGKILL);
  EXPECT_LT(hit.seconds, 15) << "the job took " << hit.seconds << " s to stop";
  EXPECT_THAT(hit.result.err, HasSubstr("rank 1 failed on host"));
  EXPECT_THAT(hit.result.err, HasSubstr("signal SIGKILL (9)"));
  EXPECT_THAT(hit.result.err,
              HasSubstr("[rank 0] warning: Terminated (the launcher stops the job: rank 1 on "));
}

TEST(TensorParallelLaunch, DryRunShowsTheGroups) {
  TempDir dir;
  JobSpec spec;
  const std::string cfg = write_job_config(dir.path(), spec);
  const RunResult r = run_dstrain({"launch", "--nproc", "8", "--dry-run", cfg, "--set",
                                   "parallel.tensor_parallel_size=2", "--set",
                                   "parallel.sequence_parallel_size=2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("tensor-parallel groups of 2 consecutive ranks (sequence "
                               "parallelism between the layers' parallel regions):\n"
                               "  group 0: ranks 0-1 on node 0 (localhost)\n"));
  EXPECT_THAT(r.out, HasSubstr("  group 3: ranks 6-7 on node 0 (localhost)\n"));
  EXPECT_THAT(r.out, HasSubstr("sequence-parallel groups of 2 ranks 2 apart (data-parallel size "
                               "2):\n  group 0: ranks 0, 2 on node 0 (localhost)\n  group 1: "
                               "ranks 1, 3 on node 0 (localhost)\n"));
  EXPECT_THAT(r.out, HasSubstr("data-parallel size 2: ZeRO shards each tensor-parallel slice "
                               "over the 4 ranks that hold it\n"));
}

TEST(TensorParallelLaunch, BadLayoutsAreExit2NamingTheKey) {
  TempDir dir;
  JobSpec spec;
  const std::string cfg = write_job_config(dir.path(), spec);
  // The world not divisible (the launcher's check).
  RunResult r = run_dstrain(
      {"launch", "--nproc", "3", "--dry-run", cfg, "--set", "parallel.tensor_parallel_size=2"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("parallel.tensor_parallel_size"));
  EXPECT_THAT(r.err, HasSubstr("the world size (3) is not divisible"));
  // The tiny model's 2 key/value heads cannot be split 4 ways: every rank stops with the model's
  // error, the launcher passes on exit 2.
  r = launch_job(cfg, 4, {"parallel.tensor_parallel_size=4"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.out + r.err, HasSubstr("num_key_value_heads (2) is not divisible by "
                                       "parallel.tensor_parallel_size (4)"));
  // A group across nodes (two hosts of 3 ranks), refused before anything starts.
  const std::string hosts = dir.file("hostfile");
  std::ofstream(hosts) << "a slots=3\nb slots=3\n";
  r = run_dstrain({"launch", "--hostfile", hosts, "--dry-run", cfg, "--set",
                   "parallel.tensor_parallel_size=2"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("tensor-parallel group 1 (ranks 2-3) spans nodes 0 (a) and 1 (b)"));
}

}  // namespace
}  // namespace dstrain::testing
