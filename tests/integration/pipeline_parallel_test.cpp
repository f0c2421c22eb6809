// Pipeline parallelism end to end: `dstrain launch` of 2 and 4 real processes over Gloo with
// parallel.pipeline_parallel_size P, against N/(P·T) processes without it (one process when N =
// P·T). A pipeline trains on exactly the batches of one rank, its micro-batches the accumulation
// steps, so each of 20 steps' loss and gradient norm (clipping on) and the final eval loss must
// agree; in fp32 within 1e-5 relative, bf16 within bf16's rounding. P = 2 and 4 (accumulation 4
// and 8), 1F1B, interleaved and GPipe, tied (the tiny model's) and untied heads, P2 × T2, P2 ×
// DP2 at ZeRO 1 and 2, LoRA (with dropout too), packed documents, the micro-step loss
// normalisation. Then its checkpoints resumed at another P, T and DP, the launcher's stages, a
// killed stage, and the configuration errors (exit 2 naming the key).

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
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

struct Case {
  std::string name;
  int world;
  int p;  // pipeline stages
  int t;  // tensor parallel inside each stage
  int stage;
  int accum;
  std::vector<std::string> extra;    // both runs
  std::vector<std::string> pp_only;  // the pipeline run only
  nlohmann::json model;              // changes to the tiny model's config.json
  double tol = 1e-5;
};

class PipelineParallelRun : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineParallelRun, LossesEqualTheRanksWithoutPipeline) {
  const Case c = GetParam();
  const TempDir models;
  std::vector<std::string> extra = c.extra;
  if (!c.model.is_null()) extra.push_back(write_model(models, c.model));
  std::vector<std::string> with_pp = extra;
  with_pp.insert(with_pp.end(), c.pp_only.begin(), c.pp_only.end());
  with_pp.push_back("parallel.pipeline_parallel_size=" + std::to_string(c.p));
  if (c.t > 1) with_pp.push_back("parallel.tensor_parallel_size=" + std::to_string(c.t));
  const RunOutput got = run(c.world, c.stage, c.accum, with_pp);
  // The data-parallel ranks alone: the same batches.
  const RunOutput want = run(c.world / (c.p * c.t), c.stage, c.accum, extra);
  ASSERT_EQ(want.curves.train.size(), static_cast<size_t>(kSteps));
  expect_same_curve(got.curves.train, want.curves.train, c.tol, "train/loss");
  expect_same_curve(got.curves.grad_norm, want.curves.grad_norm, c.tol, "grad_norm");
  ASSERT_EQ(want.curves.eval.size(), 1u);
  expect_same_curve(got.curves.eval, want.curves.eval, c.tol, "eval/loss");
  EXPECT_LT(got.curves.train.rbegin()->second, got.curves.train.begin()->second)
      << "it did not learn";
  // A LoRA run's adapter, each stage's adapters gathered: the same tensors.
  ASSERT_EQ(got.adapter.size(), want.adapter.size());
  for (const auto& [name, b] : want.adapter) {
    ASSERT_TRUE(got.adapter.count(name)) << name;
    const double scale = std::max(1e-3, b.abs().max().item<double>());
    EXPECT_LT((got.adapter.at(name) - b).abs().max().item<double>(), 10 * c.tol * scale) << name;
  }
}

const nlohmann::json kUntied = {{"tie_word_embeddings", false}};
const std::vector<std::string> kLora = {"lora.enabled=true", "lora.target_modules=[all-linear]",
                                        "training.lr=1e-2"};
const std::vector<std::string> kLoraDropout = {"lora.enabled=true",
                                               "lora.target_modules=[all-linear]",
                                               "lora.dropout=0.1", "training.lr=1e-2"};

INSTANTIATE_TEST_SUITE_P(
    Megatron, PipelineParallelRun,
    ::testing::Values(
        Case{"P2Accum4Tied", 2, 2, 1, 1, 4, {}, {}, nullptr},
        Case{"P2Accum4UntiedGpipe",
             2,
             2,
             1,
             0,
             4,
             {},
             {"parallel.pipeline_schedule=gpipe"},
             kUntied},
        Case{"P4Accum8", 4, 4, 1, 1, 8, {}, {}, nullptr},
        Case{"P2V2InterleavedAccum4",
             2,
             2,
             1,
             1,
             4,
             {},
             {"parallel.pipeline_virtual_stages=2"},
             nullptr},
        Case{"P2SplitByHandUntied", 2, 2, 1, 0, 4, {}, {"parallel.pipeline_split=[1,3]"}, kUntied},
        Case{"P2T2", 4, 2, 2, 1, 4, {}, {}, nullptr},
        // Whole hidden states between the regions: each tensor-parallel rank sends its half of
        // them, and the next stage's group all-gathers them.
        Case{"P2T2NoRegionSequenceParallel",
             4,
             2,
             2,
             1,
             4,
             {},
             {"parallel.tensor_sequence_parallel=false"},
             nullptr},
        // Every axis at once: P 2 x T 2 x DP 2 on 8 processes; interleaving with tensor
        // parallelism.
        Case{"P2T2Dp2", 8, 2, 2, 1, 4, {}, {}, nullptr},
        Case{"P2T2V2Interleaved",
             4,
             2,
             2,
             1,
             4,
             {},
             {"parallel.pipeline_virtual_stages=2"},
             nullptr},
        Case{"P2Dp2Stage1", 4, 2, 1, 1, 4, {}, {}, nullptr},
        Case{"P2Dp2Stage2", 4, 2, 1, 2, 4, {}, {}, nullptr},
        Case{"P2Lora", 2, 2, 1, 1, 4, kLora, {}, nullptr},
        // Dropout masks keyed by micro-batch and layer: each stage draws one rank's, whichever
        // order its schedule runs the micro-batches in, in a checkpoint's recompute too.
        Case{"P2LoraDropoutCheckpointed",
             2,
             2,
             1,
             1,
             4,
             kLoraDropout,
             {"training.gradient_checkpointing=true"},
             nullptr},
        // Adam's first steps amplify the rounding of tensor parallelism's sums in the adapters'
        // smallest gradients: 1e-4 of the largest value after 20 steps (T2 alone, no dropout,
        // measures the same).
        Case{"P2T2LoraDropoutInterleaved",
             4,
             2,
             2,
             1,
             4,
             kLoraDropout,
             {"parallel.pipeline_virtual_stages=2"},
             nullptr,
             3e-5},
        // Adapters on layer 0 alone: the last stage (layers 2-3 and the head) trains nothing,
        // and still passes its gradients back.
        Case{"P2LoraOnTheFirstStageOnly",
             2,
             2,
             1,
             1,
             4,
             {"lora.enabled=true", "lora.target_modules=[model.layers.0.self_attn.(q|v)_proj]",
              "training.lr=1e-2"},
             {},
             nullptr},
        Case{"P2PackedDocuments", 2, 2, 1, 1, 4, {"data.packing=documents"}, {}, nullptr},
        Case{"P2MicroStepNormalization",
             2,
             2,
             1,
             1,
             4,
             {"training.loss_normalization=micro_steps"},
             {},
             nullptr},
        Case{"P2Checkpointing", 2, 2, 1, 2, 4, {"model.gradient_checkpointing=true"}, {}, nullptr},
        // Ulysses sequence parallelism inside each stage: each rank of a stage holds half of
        // every sequence, and sends its half on to its place in the next stage.
        Case{"P2Sp2", 4, 2, 1, 1, 4, {"parallel.sequence_parallel_size=2"}, {}, nullptr},
        // The head's logits, then the loss (the last stage as without pipeline parallelism).
        Case{"P2UnfusedLoss", 2, 2, 1, 1, 4, {"model.fused_loss=false"}, {}, nullptr},
        // fp16: one loss scale for every stage (the measured difference is about 1e-5).
        Case{"P2Fp16", 2, 2, 1, 1, 4, {"training.fp16=true"}, {}, nullptr, 1e-3},
        Case{"P2Bf16", 2, 2, 1, 1, 4, {"training.bf16=true"}, {}, nullptr, 2e-2},
        // Stages without the embedding (the head's untied; the middle ones) in bf16.
        Case{"P2Bf16Untied", 2, 2, 1, 1, 4, {"training.bf16=true"}, {}, kUntied, 2e-2},
        Case{"P4Bf16", 4, 4, 1, 1, 8, {"training.bf16=true"}, {}, nullptr, 2e-2}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The memory figures are the fullest rank's: with the split reversed (an untied head as large as
// the embedding) the larger stage holds the same, and rank 0 the other share.
TEST(PipelineParallelMemory, ModelStatesAreTheFullestStages) {
  const TempDir models;
  const std::string untied = write_model(models, {{"tie_word_embeddings", false}});
  std::vector<double> states;
  for (const char* split : {"parallel.pipeline_split=[1,3]", "parallel.pipeline_split=[3,1]"}) {
    std::map<long, double> mb;
    run_curves(
        2, 1, 4, {untied, "parallel.pipeline_parallel_size=2", split},
        [&mb](const TempDir& dir) {
          mb = read_metric(dir.file("run/metrics.jsonl"), "memory/model_states_mb");
        },
        2);
    ASSERT_FALSE(mb.empty()) << split;
    states.push_back(mb.rbegin()->second);
  }
  // [1, 3]: the embedding and a layer against three layers, the final norm and the head; [3, 1]:
  // the embedding and three layers against the rest. The largest differ by the norm's weight.
  EXPECT_NEAR(states[0], states[1], 0.01 * states[1]);
}

// fp16 whose first loss scale overflows: the stages skip the steps one rank skips (one loss scale
// for every stage, from the norm summed over the pipeline), and then train alike.
TEST(PipelineParallelFp16, SkipsTheStepsOneRankSkips) {
  const std::vector<std::string> fp16 = {"training.fp16=true",
                                         "training.fp16_initial_scale_power=40"};
  std::map<long, double> skipped_pp, skipped_one;
  const auto skipped_into = [](std::map<long, double>& into) {
    return [&into](const TempDir& dir) {
      into = read_metric(dir.file("run/metrics.jsonl"), "skipped");
    };
  };
  std::vector<std::string> pp = fp16;
  pp.push_back("parallel.pipeline_parallel_size=2");
  const Curves got = run_curves(2, 1, 4, pp, skipped_into(skipped_pp), kSteps);
  const Curves want = run_curves(1, 1, 4, fp16, skipped_into(skipped_one), kSteps);
  EXPECT_FALSE(skipped_one.empty()) << "no step was skipped: the test checks nothing";
  std::vector<long> got_steps, want_steps;
  for (const auto& [step, _] : skipped_pp) got_steps.push_back(step);
  for (const auto& [step, _] : skipped_one) want_steps.push_back(step);
  EXPECT_EQ(got_steps, want_steps);
  expect_same_curve(got.train, want.train, 1e-3, "train/loss");
}

// A P2 checkpoint (stage 1, global batch 8: micro 2 × accumulation 4) resumed as P2 (bit for
// bit), on one rank, as P4, and as P2 × DP2 and P2 × T2 with the same global batch: the
// uninterrupted run's losses. Each
// stage saved its own blocks' state by name; its export is the model of the same run on one rank.
TEST(PipelineParallelResume, P2CheckpointResumesAtOtherLayouts) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 1;
  spec.accum = 4;
  spec.clip = 1.0;
  spec.max_steps = 6;
  spec.checkpoint_interval = 3;
  spec.extra_overrides = {"parallel.pipeline_parallel_size=2"};
  RunResult r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto full = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(full.size(), 6u);
  struct Layout {
    std::string name;
    int nproc, p, t, accum;
  };
  for (const Layout& l :
       {Layout{"P2 again", 2, 2, 1, 4}, Layout{"1 rank", 1, 1, 1, 4}, Layout{"P4", 4, 4, 1, 4},
        Layout{"P2xDP2", 4, 2, 1, 2}, Layout{"P2xT2", 4, 2, 2, 4}}) {
    const std::string out = dir.file("resumed-" + std::to_string(l.nproc) + "-" +
                                     std::to_string(l.p) + "-" + std::to_string(l.t));
    const auto resumed =
        resume_losses(dir.file("ckpt/step_00000003"), l.nproc,
                      {"parallel.pipeline_parallel_size=" + std::to_string(l.p),
                       "parallel.tensor_parallel_size=" + std::to_string(l.t),
                       "training.gradient_accumulation_steps=" + std::to_string(l.accum)},
                      out, l.name);
    ASSERT_EQ(resumed.size(), 3u) << l.name;
    for (const auto& [step, loss] : resumed) {
      // The same layout again: bit for bit; another one sums in another order.
      if (l.nproc == 2) {
        EXPECT_EQ(loss, full.at(step)) << l.name << " step " << step;
      } else {
        EXPECT_NEAR(loss, full.at(step), 1e-5 * std::abs(loss)) << l.name << " step " << step;
      }
    }
  }
  TempDir plain;
  spec.nproc = 1;
  spec.extra_overrides = {};
  r = run_job(plain, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_same_exports(dir.file("ckpt/step_00000003"), plain.file("ckpt/step_00000003"), plain);
}

// The idle share of a step on each rank of a 2-stage pipeline, from its trace: within each step
// (the trainer's "schedule" span), the window from stage 0's first forward to its last backward
// is the pipeline's makespan, and a rank's forward and backward spans (which leave out its waits
// for transfers) are its busy time. Measured on a model whose micro-batch takes tens of
// milliseconds per stage, so that compute dominates Gloo's latency: hidden 256, 4 layers (2 a
// stage), micro-batch 4 × 128 tokens, fp32. The formula's (P − 1)/(v·m + P − 1) assumes equal
// stages and free transfers; here the last stage also runs the head and the loss, and each
// micro-batch crosses twice (three boundaries with interleaving), so each rank's median over the
// steps after the first is held within 0.15 of it (measured on 2 cores: 1F1B m = 4: 0.23-0.25 and
// 0.21 against 0.20; m = 8: 0.15 and 0.13-0.14 against 0.11; interleaved v = 2, m = 4: 0.18-0.22
// and 0.17-0.19 against 0.11), and a pipeline without overlap between its stages idles half of
// each step. More micro-batches must idle less on every rank.
std::vector<double> idle_shares(const std::string& out_dir, int ranks) {
  struct Span {
    double begin, end;
    std::string name;
  };
  std::vector<std::vector<Span>> steps(static_cast<size_t>(ranks)), work(steps.size());
  for (int r = 0; r < ranks; ++r) {
    std::ifstream in(out_dir + "/trace/rank-" + std::to_string(r) + ".json");
    const nlohmann::json trace = nlohmann::json::parse(in);
    for (const auto& e : trace.at("traceEvents")) {
      if (e.value("ph", "") != "X") continue;
      const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
      const std::string name = e.value("name", ""), cat = e.value("cat", "");
      if (cat == "pipeline" && name == "schedule") {
        steps[static_cast<size_t>(r)].push_back({ts, ts + dur, name});
      }
      if (cat == name && (name == "forward" || name == "backward")) {
        work[static_cast<size_t>(r)].push_back({ts, ts + dur, name});
      }
    }
  }
  std::vector<std::vector<double>> shares(steps.size());
  const size_t n = steps[0].size();
  EXPECT_GE(n, 4u) << "steps traced";
  for (size_t k = 1; k < n; ++k) {
    double first = 1e300, last = 0;  // stage 0's compute in step k
    for (const Span& w : work[0]) {
      if (w.begin < steps[0][k].begin || w.end > steps[0][k].end) continue;
      first = std::min(first, w.begin);
      last = std::max(last, w.end);
    }
    for (size_t r = 0; r < steps.size(); ++r) {
      double busy = 0;
      for (const Span& w : work[r]) {
        if (w.begin >= first && w.end <= last) busy += w.end - w.begin;
      }
      shares[r].push_back(1 - busy / (last - first));
    }
  }
  std::vector<double> idle;
  for (std::vector<double>& s : shares) {
    std::sort(s.begin(), s.end());
    idle.push_back(s.empty() ? 1.0 : s[s.size() / 2]);
  }
  return idle;
}

TEST(PipelineParallelBubble, MeasuredIdleShareFollowsTheFormula) {
  TempDir dir;
  const std::string model = write_model(dir, {{"hidden_size", 256},
                                              {"intermediate_size", 1024},
                                              {"num_attention_heads", 4},
                                              {"num_key_value_heads", 4},
                                              {"head_dim", 64},
                                              {"tie_word_embeddings", false}});
  struct Run {
    std::string name;
    int m, v;
  };
  std::map<std::string, std::vector<double>> measured;
  for (const Run& run : {Run{"1f1b-m4", 4, 1}, Run{"1f1b-m8", 8, 1}, Run{"interleaved-m4", 4, 2}}) {
    JobSpec spec;
    spec.nproc = 2;
    spec.stage = 1;
    spec.micro = 4;
    spec.accum = run.m;
    spec.max_length = 128;
    spec.max_steps = 6;
    spec.extra_overrides = {model, "parallel.pipeline_parallel_size=2",
                            "parallel.pipeline_virtual_stages=" + std::to_string(run.v),
                            "logging.trace=true", "logging.out_dir=" + dir.file(run.name)};
    const RunResult r = run_job(dir, spec);
    ASSERT_EQ(r.exit_code, 0) << run.name << "\n" << r.out << r.err;
    const double formula = 1.0 / (run.v * run.m + 1);
    measured[run.name] = idle_shares(dir.file(run.name), 2);
    for (int rank = 0; rank < 2; ++rank) {
      const double idle = measured[run.name][static_cast<size_t>(rank)];
      std::printf("%s rank %d: idle %.3f of each step, formula %.3f\n", run.name.c_str(), rank,
                  idle, formula);
      EXPECT_NEAR(idle, formula, 0.15) << run.name << " rank " << rank;
    }
  }
  for (size_t rank = 0; rank < 2; ++rank) {
    EXPECT_LT(measured["1f1b-m8"][rank], measured["1f1b-m4"][rank]) << "rank " << rank;
  }
}

// A P2 job hit with `signal` on rank 1 (the last stage) once it has committed a checkpoint
// (hit_rank): what the launcher said, and how long after the signal the job had ended.
RankHit hit_last_stage(int signal, const std::vector<std::string>& env) {
  JobSpec spec;
  spec.nproc = 2;
  spec.accum = 4;
  spec.max_steps = 100000;
  spec.checkpoint_interval = 2;
  spec.extra_overrides = {"parallel.pipeline_parallel_size=2"};
  return hit_rank(spec, 1, signal, env);
}

TEST(PipelineParallelFailure, AKilledStageTearsTheJobDownAndIsNamed) {
  const RankHit hit = hit_last_stage(SIGKILL, {});
  EXPECT_LT(hit.seconds, 15) << "the job took " << hit.seconds << " s to stop";
  EXPECT_THAT(hit.result.err, HasSubstr("rank 1 failed on host"));
  EXPECT_THAT(hit.result.err, HasSubstr("signal SIGKILL (9)"));
}

// A stage that stops sending (a frozen process): its neighbours wait on their transfers, and the
// launcher's heartbeat watch names the frozen rank after DSTRAIN_COMM_TIMEOUT and ends the job.
TEST(PipelineParallelFailure, AFrozenStageIsNamedAfterTheTimeout) {
  const RankHit hit = hit_last_stage(SIGSTOP, {"DSTRAIN_COMM_TIMEOUT=5"});
  EXPECT_LT(hit.seconds, 5 + 10) << "the job took " << hit.seconds << " s to stop";
  EXPECT_THAT(hit.result.err, HasSubstr("dstrain launch: rank 1 failed on host localhost"));
  EXPECT_THAT(hit.result.err, HasSubstr("stopped responding (no heartbeat for"));
}

TEST(PipelineParallelLaunch, DryRunShowsTheStages) {
  TempDir dir;
  JobSpec spec;
  spec.accum = 4;
  const std::string cfg = write_job_config(dir.path(), spec);
  const RunResult r = run_dstrain(
      {"launch", "--nproc", "4", "--dry-run", cfg, "--set", "parallel.pipeline_parallel_size=2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("pipeline stages: 2 blocks of 2 consecutive ranks (1f1b):\n"
                               "  stage 0: ranks 0-1 on node 0 (localhost)\n"
                               "  stage 1: ranks 2-3 on node 0 (localhost)\n"
                               "pipelines of 2 ranks 2 apart:\n"
                               "  group 0: ranks 0, 2 on node 0 (localhost)\n"
                               "  group 1: ranks 1, 3 on node 0 (localhost)\n"
                               "data-parallel size 2: ZeRO shards each stage over its 2 ranks\n"));
}

TEST(PipelineParallelLaunch, BadLayoutsAreExit2NamingTheKey) {
  TempDir dir;
  JobSpec spec;
  spec.accum = 4;
  const std::string cfg = write_job_config(dir.path(), spec);
  // P not dividing the world: the launcher's check, before anything starts.
  RunResult r = run_dstrain(
      {"launch", "--nproc", "3", "--dry-run", cfg, "--set", "parallel.pipeline_parallel_size=2"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("parallel.pipeline_parallel_size"));
  EXPECT_THAT(r.err, HasSubstr("the world size (3) is not divisible by pipeline_parallel_size"));
  // More stages than the tiny model's 6 blocks (embedding, 4 layers, head): every rank stops
  // with the error, the launcher passes on exit 2.
  r = launch_job(cfg, 8, {"parallel.pipeline_parallel_size=8"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.out + r.err, HasSubstr("parallel.pipeline_parallel_size: 8 pipeline stages for a "
                                       "model of 6 blocks; expected at most 6"));
  // A split by hand that is not the model's 4 layers.
  r = launch_job(cfg, 2, {"parallel.pipeline_parallel_size=2", "parallel.pipeline_split=[2,3]"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.out + r.err, HasSubstr("parallel.pipeline_split: the stages' layer counts add up "
                                       "to 5, but the model has 4 layers"));
  // ZeRO 3, refused with the reason by the config check.
  r = launch_job(cfg, 2, {"parallel.pipeline_parallel_size=2", "zero.stage=3"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("pipeline parallelism runs with ZeRO stage 0, 1 or 2, not 3"));
}

}  // namespace
}  // namespace dstrain::testing
