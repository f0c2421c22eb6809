// Mixture-of-Experts models end to end (docs/models.md#mixture-of-experts), each shaped like the
// tiny model: Qwen3-MoE with a dense layer among its MoE layers and renormalised top-k weights, and
// Mixtral. `dstrain launch` of 2 real processes over Gloo at ZeRO 0, 2 and 3 (the experts' stacks
// sharded) against one process with the same global batch, and a pipeline of 2 stages against one
// process: each of 20 steps' loss and the eval loss (over the whole eval set, which is the same
// set on any number of ranks) within 1e-5 relative in fp32, the gradient norms within 1e-3: at the
// steps where the norm jumps (to 13-46, from 0.1-1) the runs' last-bit differences (the reduction's
// order) show in it by up to 5.7e-4, while every loss agrees within 1.3e-7. The same with the
// router losses (and their metrics, and the experts' load), selective checkpointing and the
// optimizer offloaded; routing skewed onto one expert on one rank at ZeRO 3; a resume bit for bit.
// Expert parallelism (E_p 2 and 4, ZeRO 1-3, with a pipeline, the router losses) against one
// process the same way; an E_p 2 x DP 2 checkpoint resumed at E_p 4 and on one rank, its export
// the one-rank run's; a rank killed mid-run named; the dry run's expert groups.
// The export holds the Hub's per-expert tensors; what is not supported yet is refused with exit 2
// naming the key, and a router key without effect warns.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tests/integration/parallel_runs.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

using ::testing::HasSubstr;

const nlohmann::json kQwen3Moe = {{"model_type", "qwen3_moe"},
                                  {"num_experts", 4},
                                  {"num_experts_per_tok", 2},
                                  {"moe_intermediate_size", 64},
                                  {"norm_topk_prob", true},
                                  {"mlp_only_layers", {1}},
                                  {"head_dim", 32},
                                  {"tie_word_embeddings", false}};
const nlohmann::json kMixtral = {{"model_type", "mixtral"},
                                 {"num_local_experts", 4},
                                 {"num_experts_per_tok", 2},
                                 {"intermediate_size", 64}};

// The router losses on: the load-balancing loss (weighted to matter) and the z-loss.
const std::vector<std::string> kRouterLosses = {"model.router_aux_loss=true",
                                                "model.router_aux_loss_coef=0.1",
                                                "model.router_z_loss_coef=0.01"};

// ... with selective checkpointing (the recompute routes as the forward did, and the losses'
// gradient reaches the recomputed routers).
const std::vector<std::string> kRouterLossesSelective = [] {
  std::vector<std::string> sets = kRouterLosses;
  sets.push_back("model.gradient_checkpointing=selective");
  return sets;
}();

struct Case {
  std::string name;
  nlohmann::json model;
  int world;
  int stage;
  int accum;  // the multi-rank run's; one process takes world × accum (data parallel) or accum
  std::vector<std::string> parallel;   // the multi-rank run only (with a pipeline, `accum` alike)
  std::vector<std::string> both = {};  // both runs
};

// The router's metrics of a run: each key's curve.
using Metrics = std::map<std::string, std::map<long, double>>;
const std::vector<std::string> kRouterKeys = {"train/aux_loss",
                                              "train/z_loss",
                                              "moe/load_max_over_mean",
                                              "moe/dead_experts",
                                              "moe/layer_2/load_max_over_mean",
                                              "moe/expert_parallel/received_max_over_mean"};

Curves run_with_metrics(int world, int stage, int accum, const std::vector<std::string>& extra,
                        Metrics& metrics) {
  return run_curves(
      world, stage, accum, extra,
      [&](const TempDir& dir) {
        for (const std::string& key : kRouterKeys)
          metrics[key] = read_metric(dir.file("run/metrics.jsonl"), key);
      },
      kSteps);
}

class MoeRun : public ::testing::TestWithParam<Case> {};

// With the router losses each micro-batch's are its own (as transformers computes them per
// forward): 2 ranks' micro-batches are the 1 process's accumulated ones, and so are the losses and
// the experts' load summed over the ranks.
TEST_P(MoeRun, LossesEqualOneProcessWithTheSameBatches) {
  const Case c = GetParam();
  const TempDir models;
  std::vector<std::string> extra = {write_model(models, c.model), "training.eval_max_batches=auto"};
  extra.insert(extra.end(), c.both.begin(), c.both.end());
  std::vector<std::string> with = extra;
  with.insert(with.end(), c.parallel.begin(), c.parallel.end());
  Metrics got_metrics, want_metrics;
  const Curves got = run_with_metrics(c.world, c.stage, c.accum, with, got_metrics);
  // One process takes every data-parallel rank's micro-batches (a pipeline's stages and a
  // sequence-parallel group share theirs).
  int shared = 1;
  for (const std::string& set : c.parallel) {
    for (const std::string key :
         {"parallel.pipeline_parallel_size=", "parallel.sequence_parallel_size="}) {
      if (set.rfind(key, 0) == 0) shared *= std::stoi(set.substr(key.size()));
    }
  }
  const Curves want = run_with_metrics(1, 0, c.world / shared * c.accum, extra, want_metrics);
  ASSERT_EQ(want.train.size(), static_cast<size_t>(kSteps));
  expect_same_curve(got.train, want.train, 1e-5, "train/loss");
  expect_same_curve(got.grad_norm, want.grad_norm, 1e-3, "grad_norm");
  ASSERT_EQ(want.eval.size(), 1u);
  expect_same_curve(got.eval, want.eval, 1e-5, "eval/loss");
  EXPECT_LT(got.train.rbegin()->second, got.train.begin()->second) << "it did not learn";
  // The experts' load every step (log_interval 1), whatever the routing (a MoE layer: layer 2).
  for (const char* key : {"moe/load_max_over_mean", "moe/layer_2/load_max_over_mean"}) {
    ASSERT_EQ(want_metrics[key].size(), static_cast<size_t>(kSteps)) << key;
    expect_same_curve(got_metrics[key], want_metrics[key], 1e-6, key);
    EXPECT_GE(want_metrics[key].begin()->second, 1.0) << key;
  }
  expect_same_curve(got_metrics["moe/dead_experts"], want_metrics["moe/dead_experts"], 0,
                    "moe/dead_experts");
  // Under expert parallelism: how unevenly its ranks' experts were loaded, every step.
  const bool ep = std::any_of(c.parallel.begin(), c.parallel.end(), [](const std::string& set) {
    return set.find("expert_") != std::string::npos;
  });
  const auto& received = got_metrics["moe/expert_parallel/received_max_over_mean"];
  EXPECT_EQ(received.size(), ep ? static_cast<size_t>(kSteps) : 0u);
  for (const auto& [step, ratio] : received) EXPECT_GE(ratio, 1.0) << "step " << step;
  const bool losses =
      std::find(c.both.begin(), c.both.end(), "model.router_aux_loss=true") != c.both.end();
  EXPECT_EQ(want_metrics["train/aux_loss"].size(), losses ? static_cast<size_t>(kSteps) : 0u);
  if (losses) {
    expect_same_curve(got_metrics["train/aux_loss"], want_metrics["train/aux_loss"], 1e-5,
                      "train/aux_loss");
    expect_same_curve(got_metrics["train/z_loss"], want_metrics["train/z_loss"], 1e-5,
                      "train/z_loss");
    // E · Σ f·P is at least 1 (1 only when perfectly balanced).
    EXPECT_GE(want_metrics["train/aux_loss"].begin()->second, 1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Experts, MoeRun,
    ::testing::Values(
        Case{"Qwen3MoeZero0", kQwen3Moe, 2, 0, 1, {}},
        Case{"Qwen3MoeZero2", kQwen3Moe, 2, 2, 1, {}},
        Case{"Qwen3MoeZero3", kQwen3Moe, 2, 3, 1, {}}, Case{"MixtralZero3", kMixtral, 2, 3, 1, {}},
        Case{"Qwen3MoeRouterLossesZero3", kQwen3Moe, 2, 3, 1, {}, kRouterLosses},
        Case{"MixtralRouterLossesZero2Accumulating", kMixtral, 2, 2, 2, {}, kRouterLosses},
        Case{"Qwen3MoeRouterLossesSelectiveCheckpointing",
             kQwen3Moe,
             2,
             2,
             1,
             {},
             kRouterLossesSelective},
        Case{"Qwen3MoeZero3OptimizerOffloaded",
             kQwen3Moe,
             2,
             3,
             1,
             {"zero.offload_optimizer.device=cpu"}},
        // The router losses pool every stage's layers: the statistics go forward with the
        // activations and their gradient back with the gradients (interleaved: 4 virtual stages).
        Case{"Qwen3MoeRouterLossesPipeline2Interleaved",
             kQwen3Moe,
             2,
             1,
             4,
             {"parallel.pipeline_parallel_size=2", "parallel.pipeline_virtual_stages=2"},
             kRouterLosses},
        // Expert parallelism: each rank 1/E_p of the experts, its tokens sent to them; with 4
        // ranks at E_p 2 each expert is held by 2 ranks (ZeRO shards it over them).
        Case{"MixtralExperts2Zero1", kMixtral, 2, 1, 1, {"parallel.expert_parallel_size=2"}},
        Case{"Qwen3MoeExperts2Data2RouterLossesZero3",
             kQwen3Moe,
             4,
             3,
             1,
             {"parallel.expert_parallel_size=2"},
             kRouterLosses},
        Case{
            "Qwen3MoeExperts4Zero2", kQwen3Moe, 4, 2, 1, {"parallel.expert_model_parallel_size=4"}},
        // The expert-parallel ranks share each sequence (Ulysses), each its part of the tokens.
        Case{"Qwen3MoeExperts2Sequence2Zero2",
             kQwen3Moe,
             2,
             2,
             1,
             {"parallel.sequence_parallel_size=2", "parallel.expert_parallel_size=2"}},
        // LoRA on the attention with the routers trained whole: every expert frozen, sharded
        // (ZeRO 3) over the ranks holding it by an engine with nothing to train.
        Case{"Qwen3MoeExperts2LoraZero3",
             kQwen3Moe,
             2,
             3,
             1,
             {"parallel.expert_parallel_size=2"},
             {"lora.enabled=true", "lora.target_modules=[q_proj,v_proj]",
              "lora.modules_to_save=[mlp.gate]", "training.lr=1e-2"}},
        Case{"Qwen3MoeExperts2Pipeline2",
             kQwen3Moe,
             4,
             1,
             2,
             {"parallel.pipeline_parallel_size=2", "parallel.expert_parallel_size=2"}}),
    [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// A Qwen3-MoE (top-1) whose router sends every 'a' to expert 0 and spreads every other byte:
// the embedding's dimension 0 is 5 for 'a' and 0 elsewhere, nothing (attention, MLPs, experts)
// writes that dimension, and each router gives expert 0 the logit 10 · that dimension (about
// 110 after the norm) and no weight on it to the others.
std::string write_skewed_model(const TempDir& dir) {
  nlohmann::json config = kQwen3Moe;
  config["num_experts_per_tok"] = 1;
  config["norm_topk_prob"] = false;
  const std::string set = write_model(dir, config);
  const model::ModelConfig c = model::load_model_config(dir.file("model/config.json"));
  model::DecoderModel m = model::build_model(c, torch::kFloat32, 11);
  {
    torch::NoGradGuard no_grad;
    auto p = m->named_parameters();
    const torch::Tensor embed = p["model.embed_tokens.weight"];
    embed.select(1, 0).zero_();
    embed['a'][0] = 5.0;
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const std::string at = fmt::format("model.layers.{}.", l);
      p[at + "self_attn.o_proj.weight"][0].zero_();
      if (!c.is_moe_layer(l)) {
        p[at + "mlp.down_proj.weight"][0].zero_();
        continue;
      }
      p[at + "mlp.experts.down_proj"].select(1, 0).zero_();
      const torch::Tensor gate = p[at + "mlp.gate.weight"];
      gate.select(1, 0).zero_();
      gate[0].zero_();
      gate[0][0] = 10.0;
    }
  }
  model::save_weights(*m, dir.file("model"), torch::kFloat32);
  return set;
}

// One line per sample (no packing, unshuffled): the first rank's samples of every step all 'a'
// (longer than a sample: no padding), the second's the corpus's lines.
std::string write_skewed_corpus(const TempDir& dir, bool only_a) {
  std::ifstream in(std::string(DSTRAIN_SOURCE_DIR) + "/configs/data/tiny_corpus.txt");
  std::ofstream out(dir.file("skewed.txt"));
  std::string line;
  for (int i = 0; i < 200 && std::getline(in, line); ++i) {
    const bool a = only_a || i % 4 < 2;
    out << (a ? std::string(48, 'a') : line) << "\n";
  }
  return "data.train_path=" + dir.file("skewed.txt");
}

// ZeRO-3 with one rank's tokens all on expert 0 (its other experts get none) and the other's
// spread: the gathers are whole blocks whatever the routing, so nothing waits on a rank that has
// no tokens for an expert, and the losses are one process's with the same micro-batches. Alone,
// the 'a' samples leave 3 of the 4 experts of every MoE layer without a token.
TEST(MoeRouting, ZeroThreeWithOneRanksTokensOnOneExpert) {
  const TempDir models, data;
  const std::vector<std::string> common = {
      write_skewed_model(models), "model.init=pretrained", "data.packing=pad",
      "data.shuffle=false",       "data.eval_split=0",     "model.router_aux_loss=true"};
  Metrics alone_metrics;
  std::vector<std::string> alone = common;
  alone.push_back(write_skewed_corpus(data, true));
  run_with_metrics(1, 3, 1, alone, alone_metrics);
  ASSERT_FALSE(alone_metrics["moe/dead_experts"].empty());
  EXPECT_EQ(alone_metrics["moe/dead_experts"].at(1), 3 * 3);  // 3 MoE layers, 3 experts idle

  std::vector<std::string> mixed = common;
  mixed.push_back(write_skewed_corpus(data, false));
  Metrics got_metrics, want_metrics;
  const Curves got = run_with_metrics(2, 3, 1, mixed, got_metrics);
  const Curves want = run_with_metrics(1, 0, 2, mixed, want_metrics);
  ASSERT_EQ(want.train.size(), static_cast<size_t>(kSteps));
  expect_same_curve(got.train, want.train, 1e-5, "train/loss");
  expect_same_curve(got_metrics["train/aux_loss"], want_metrics["train/aux_loss"], 1e-5,
                    "train/aux_loss");
  // The second rank's tokens reach experts the first's leave idle.
  EXPECT_LT(want_metrics["moe/dead_experts"].at(1), 3 * 3);
}

// Expert parallelism with every token of both ranks routed to expert 0 (the first rank's): that
// rank's experts compute every row, the other's none, and the run is one process's with the same
// micro-batches (E_p 2 at ZeRO 3, the router losses on).
TEST(MoeRouting, ExpertParallelWithEveryTokenOnOneRanksExperts) {
  const TempDir models, data;
  const std::vector<std::string> common = {
      write_skewed_model(models),     "model.init=pretrained", "data.packing=pad",
      "data.shuffle=false",           "data.eval_split=0",     "model.router_aux_loss=true",
      write_skewed_corpus(data, true)};
  std::vector<std::string> spread = common;
  spread.push_back("parallel.expert_parallel_size=2");
  Metrics got_metrics, want_metrics;
  const Curves got = run_with_metrics(2, 3, 1, spread, got_metrics);
  const Curves want = run_with_metrics(1, 0, 2, common, want_metrics);
  ASSERT_EQ(want.train.size(), static_cast<size_t>(kSteps));
  expect_same_curve(got.train, want.train, 1e-5, "train/loss");
  expect_same_curve(got_metrics["train/aux_loss"], want_metrics["train/aux_loss"], 1e-5,
                    "train/aux_loss");
  // One of the two expert-parallel ranks computed every row: its rows over the mean, 2.
  const auto& received = got_metrics["moe/expert_parallel/received_max_over_mean"];
  ASSERT_EQ(received.size(), static_cast<size_t>(kSteps));
  for (const auto& [step, ratio] : received) EXPECT_DOUBLE_EQ(ratio, 2.0) << "step " << step;
}

// A MoE run with the router losses at ZeRO 3 resumed from its step-10 checkpoint: every later
// step's loss and load-balancing loss exactly the uninterrupted run's.
// 20 steps at ZeRO 3 with the router losses and `more` overrides (the run's log says `says`),
// then a resume from step 10: the losses after it are the uninterrupted run's, bit for bit.
void expect_resume_bit_identical(const std::vector<std::string>& more, const std::string& says) {
  TempDir dir;
  const TempDir models;
  JobSpec spec = resumable_job();
  spec.stage = 3;
  spec.extra_overrides = {write_model(models, kQwen3Moe)};
  spec.extra_overrides.insert(spec.extra_overrides.end(), kRouterLosses.begin(),
                              kRouterLosses.end());
  spec.extra_overrides.insert(spec.extra_overrides.end(), more.begin(), more.end());
  const RunResult full_run = run_job(dir, spec);
  ASSERT_EQ(full_run.exit_code, 0) << full_run.out << full_run.err;
  EXPECT_NE((full_run.out + full_run.err).find(says), std::string::npos) << full_run.err;
  std::map<std::string, std::map<long, double>> full, resumed;
  for (const char* key : {"train/loss", "train/aux_loss"})
    full[key] = read_metric(dir.file("run/metrics.jsonl"), key);
  ASSERT_EQ(full["train/loss"].size(), 20u);
  std::filesystem::remove(dir.file("run/metrics.jsonl"));
  const RunResult resumed_run = run_dstrain({"resume", dir.file("ckpt/step_00000010")}, {}, 300);
  ASSERT_EQ(resumed_run.exit_code, 0) << resumed_run.out << resumed_run.err;
  for (const char* key : {"train/loss", "train/aux_loss"}) {
    resumed[key] = read_metric(dir.file("run/metrics.jsonl"), key);
    ASSERT_EQ(resumed[key].size(), 10u) << key;
    expect_same_losses_after(10, resumed[key], full[key]);
  }
}

TEST(MoeResume, ResumesBitIdentically) {
  expect_resume_bit_identical({}, "zero stage 3");
}

// LoRA on an expert stack with the routers trained whole (modules_to_save): their master weights
// and optimizer state are in the checkpoint.
TEST(MoeResume, LoraOnTheExpertsWithTheRoutersTrainedWholeResumesBitIdentically) {
  expect_resume_bit_identical(
      {"lora.enabled=true", "lora.target_modules=[q_proj]",
       "lora.target_parameters=[mlp.experts.down_proj]", "lora.modules_to_save=[mlp.gate]",
       "lora.dropout=0", "training.lr=1e-2"},
      "trained whole");
}

// The export of a trained Qwen3-MoE holds each expert's projections under the Hub's names (and the
// dense layer's MLP as it is), not the stacks.
TEST(MoeExport, TheHubsPerExpertTensors) {
  TempDir dir;
  const TempDir models;
  JobSpec spec;
  spec.max_steps = 2;
  spec.save_final = true;
  spec.extra_overrides = {write_model(models, kQwen3Moe)};
  const RunResult r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const RunResult e =
      run_dstrain({"export", dir.file("ckpt/step_00000002"), "--out", dir.file("export")}, {}, 120);
  ASSERT_EQ(e.exit_code, 0) << e.out << e.err;
  const model::SafetensorsSet files(dir.file("export"));
  EXPECT_TRUE(files.contains("model.layers.0.mlp.experts.3.down_proj.weight"));
  EXPECT_TRUE(files.contains("model.layers.2.mlp.experts.0.gate_proj.weight"));
  EXPECT_TRUE(files.contains("model.layers.2.mlp.gate.weight"));
  EXPECT_TRUE(files.contains("model.layers.1.mlp.up_proj.weight"));  // the dense layer
  EXPECT_FALSE(files.contains("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_EQ(files.info("model.layers.0.mlp.experts.1.up_proj.weight").shape,
            (std::vector<int64_t>{64, 128}));
}

// An E_p 2 x DP 2 checkpoint (4 ranks, ZeRO 2, global batch 8: micro 2 x accumulation 2 x 2
// replicas of each expert) resumed at E_p 4 and on one rank with the same global batch: the
// uninterrupted run's losses. The checkpoint holds every expert by its index: its export is the
// model of the same run on one rank.
TEST(MoeExpertParallel, E2Dp2CheckpointResumesAtE4AndOnOneRank) {
  TempDir dir;
  const std::string model = write_model(dir, kQwen3Moe);
  JobSpec spec;
  spec.nproc = 4;
  spec.stage = 2;
  spec.accum = 2;
  spec.clip = 1.0;
  spec.max_steps = 6;
  spec.checkpoint_interval = 3;
  spec.extra_overrides = {model, "parallel.expert_parallel_size=2"};
  RunResult r = run_job(dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto full = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(full.size(), 6u);
  struct Layout {
    std::string name;
    int nproc, e, accum;
  };
  for (const Layout& l : {Layout{"E4", 4, 4, 2}, Layout{"1 rank", 1, 1, 8}}) {
    const std::string out = dir.file("resumed-" + std::to_string(l.nproc));
    const auto resumed =
        resume_losses(dir.file("ckpt/step_00000003"), l.nproc,
                      {"parallel.expert_parallel_size=" + std::to_string(l.e),
                       "training.gradient_accumulation_steps=" + std::to_string(l.accum)},
                      out, l.name);
    ASSERT_EQ(resumed.size(), 3u) << l.name;
    for (const auto& [step, loss] : resumed) {
      EXPECT_NEAR(loss, full.at(step), 1e-5 * std::abs(loss)) << l.name << " step " << step;
    }
  }
  TempDir plain;
  spec.nproc = 1;
  spec.accum = 8;
  spec.extra_overrides = {model};
  r = run_job(plain, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_same_exports(dir.file("ckpt/step_00000003"), plain.file("ckpt/step_00000003"), plain);
}

// An expert-parallel job of 2 ranks (hit_rank), whose group exchanges tokens at every MoE layer.
RankHit hit_expert_parallel_rank(int signal, const std::vector<std::string>& env = {}) {
  const TempDir models;
  JobSpec spec;
  spec.nproc = 2;
  spec.max_steps = 100000;
  spec.checkpoint_interval = 2;
  spec.extra_overrides = {write_model(models, kQwen3Moe), "parallel.expert_parallel_size=2"};
  return hit_rank(spec, 1, signal, env);
}

// A killed rank: the job stops within seconds and names it, as for the other collectives.
TEST(MoeExpertParallel, AKilledRankTearsTheJobDownAndIsNamed) {
  const RankHit hit = hit_expert_parallel_rank(SIGKILL);
  EXPECT_LT(hit.seconds, 15) << "the job took " << hit.seconds << " s to stop";
  EXPECT_THAT(hit.result.err, HasSubstr("rank 1 failed on host"));
  EXPECT_THAT(hit.result.err, HasSubstr("signal SIGKILL (9)"));
}

// A frozen rank: its group's all-to-alls wait on it, and the launcher's heartbeat watch names it
// after DSTRAIN_COMM_TIMEOUT and ends the job (a timeout, not a hang).
TEST(MoeExpertParallel, AFrozenRankIsNamedAfterTheTimeout) {
  const RankHit hit = hit_expert_parallel_rank(SIGSTOP, {"DSTRAIN_COMM_TIMEOUT=5"});
  EXPECT_LT(hit.seconds, 5 + 10) << "the job took " << hit.seconds << " s to stop";
  EXPECT_THAT(hit.result.err, HasSubstr("dstrain launch: rank 1 failed on host localhost"));
  EXPECT_THAT(hit.result.err, HasSubstr("stopped responding (no heartbeat for"));
}

// The launcher's dry run shows the experts' groups beside the data-parallel ranks, and the memory
// estimate each rank's share of the experts and the dispatch's worst case.
TEST(MoeExpertParallel, DryRunShowsTheExpertGroupsAndEstimateTheirShare) {
  TempDir dir;
  const std::string cfg = write_job_config(dir.path(), JobSpec{});
  const RunResult e =
      run_dstrain({"estimate", "--gpus", "8", cfg, "--set", write_model(dir, kQwen3Moe), "--set",
                   "parallel.expert_parallel_size=4"});
  ASSERT_EQ(e.exit_code, 0) << e.out << e.err;
  EXPECT_THAT(e.out, HasSubstr("Expert parallelism 4: each rank holds 1 of the 4 experts of every "
                               "MoE layer, sharded over the 2 rank(s) that hold the same ones"));
  EXPECT_THAT(e.out, HasSubstr("(this rank's experts): "));
  const RunResult r = run_dstrain(
      {"launch", "--nproc", "8", "--dry-run", cfg, "--set", "parallel.expert_parallel_size=4"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("expert-parallel groups of 4 consecutive ranks, each holding 1/4 "
                               "of every MoE layer's experts (tokens exchanged all-to-all):\n"
                               "  group 0: ranks 0-3 on node 0 (localhost)\n"
                               "  group 1: ranks 4-7 on node 0 (localhost)\n"));
  EXPECT_THAT(r.out, HasSubstr("expert-data-parallel size 2: ZeRO shards each rank's experts over "
                               "the 2 ranks that hold the same ones (4 apart)\n"));
}

// Not yet supported with a MoE model: exit 2 naming the key.
TEST(MoeRefusals, EachNamesItsKey) {
  const TempDir models;
  const std::string model = write_model(models, kQwen3Moe);
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"parallel.tensor_parallel_size=2"}, "parallel.tensor_parallel_size"},
      {{"lora.enabled=true", "lora.target_modules=all-linear"}, "lora.target_modules"},
      {{"model.tiled_mlp=64"}, "model.tiled_mlp"},
      {{"parallel.expert_parallel_size=2", "lora.enabled=true",
        "lora.target_parameters=[mlp.experts.down_proj]"},
       "lora.target_parameters"},
      {{"parallel.expert_parallel_size=3"}, "parallel.expert_parallel_size"}};
  for (const auto& [sets, key] : refused) {
    TempDir dir;
    JobSpec spec;
    spec.nproc = sets[0].find("parallel.") == 0 ? 2 : 1;
    spec.max_steps = 1;
    spec.extra_overrides = {model};
    spec.extra_overrides.insert(spec.extra_overrides.end(), sets.begin(), sets.end());
    const RunResult r = run_job(dir, spec);
    EXPECT_EQ(r.exit_code, 2) << key << "\n" << r.out << r.err;
    EXPECT_THAT(r.out + r.err, HasSubstr(key));
    EXPECT_THAT(r.out + r.err, HasSubstr("Mixture-of-Experts"));
  }
}

// The router keys on a dense model, and a float32 router in a float32 run: a warning that they
// have no effect, and the run goes on.
TEST(MoeRefusals, RouterKeysWithoutEffectWarn) {
  const TempDir models;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"model.router_z_loss_coef=0.01"}, "not a Mixture-of-Experts model"},
      {{write_model(models, kQwen3Moe), "model.router_dtype=float32"},
       "model.router_dtype: float32 has no effect: the run computes in float32"}};
  for (const auto& [sets, said] : cases) {
    TempDir dir;
    JobSpec spec;
    spec.max_steps = 1;
    spec.extra_overrides = sets;
    const RunResult r = run_job(dir, spec);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_THAT(r.out + r.err, HasSubstr(said));
  }
}

}  // namespace
}  // namespace dstrain::testing
