// LoRA end to end with `dstrain launch --nproc 2`: the seed project's lora section trains the tiny
// model, the adapter and the merged model export, resume continues bit-identically and refuses
// another base model, and a run continues from an exported adapter.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "ckpt/shards.h"
#include "lora/adapter_io.h"
#include "lora/lora_model.h"
#include "model/model.h"
#include "model/model_config.h"
#include "model/weights.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {
namespace stdfs = std::filesystem;

// The shared folder sits beside the main checkout, or two levels up from a worktree.
std::string seed_config() {
  for (const char* rel : {"/../shared", "/../../shared"}) {
    const std::string p = std::string(DSTRAIN_SOURCE_DIR) + rel + "/seed-configs/train.yaml";
    if (std::ifstream(p)) return p;
  }
  return "";
}
// The seed project's section (r 16, alpha 32, dropout 0.05, q/k/v/o_proj), used when present.
const std::string kFallbackSection =
    "lora:\n  r: 16\n  alpha: 32\n  dropout: 0.05\n"
    "  target_modules: [\"q_proj\",\"k_proj\",\"v_proj\",\"o_proj\"]\n";

std::string seed_lora_section() {
  std::ifstream in(seed_config());
  std::string line, out;
  bool inside = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != ' ' && line[0] != '#') inside = line.rfind("lora:", 0) == 0;
    if (inside) out += line + "\n";
  }
  return out.empty() ? kFallbackSection : out;
}

// The integration job config with a lora section appended.
std::string write_lora_job(const TempDir& dir, const JobSpec& spec) {
  const std::string cfg = write_job_config(dir.path(), spec);
  std::ofstream(cfg, std::ios::app) << seed_lora_section();
  return cfg;
}

double mean_of_last(const std::map<long, double>& m, int n) {
  double s = 0;
  int k = 0;
  for (auto it = m.rbegin(); it != m.rend() && k < n; ++it, ++k) s += it->second;
  return s / k;
}

model::ModelConfig tiny_config() {
  return model::load_model_config(DSTRAIN_SOURCE_DIR "/configs/models/tiny/config.json");
}

// The merged export against base (seed 7, as write_job_config) + B·A·scale computed here.
void expect_merged_is_base_plus_delta(const std::string& merged_dir,
                                      const std::string& adapter_dir) {
  torch::NoGradGuard no_grad;
  const lora::Adapter adapter = lora::read_adapter(adapter_dir);
  model::DecoderModel base = model::build_model(tiny_config(), torch::kFloat, 7);
  model::DecoderModel merged(tiny_config());
  model::load_weights(*merged, merged_dir);
  std::map<std::string, torch::Tensor> delta;
  for (const auto& w : adapter.weights) {
    delta[w.module + ".weight"] = torch::matmul(w.B, w.A) * adapter.options.scale();
  }
  ASSERT_EQ(delta.size(), 16u);
  const auto merged_params = merged->named_parameters();
  int changed = 0;
  for (const auto& p : base->named_parameters()) {
    const torch::Tensor& got = merged_params[p.key()];
    const auto it = delta.find(p.key());
    if (it == delta.end()) {
      EXPECT_TRUE(torch::equal(got, p.value())) << p.key() << " is not the base weight";
    } else {
      EXPECT_LT((got - (p.value() + it->second)).abs().max().item<float>(), 1e-6) << p.key();
      changed += it->second.abs().max().item<float>() > 1e-5;
    }
  }
  EXPECT_EQ(changed, 16) << "the trained adapters should have moved every B away from zero";
}

TEST(LoraTrain, SeedSectionTrainsOnTwoRanksAndExportsAdapterAndMergedModel) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 2;
  spec.micro = 4;
  spec.max_steps = 30;
  spec.save_final = true;
  const std::string cfg = write_lora_job(dir, spec);
  RunResult r = launch_job(cfg, 2, {"training.lr=1e-2"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto loss = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(loss.size(), 30u);
  EXPECT_LT(mean_of_last(loss, 5), loss.at(1) - 0.3) << "LoRA training did not lower the loss";

  // The checkpoint holds the adapters only, and names its base.
  ckpt::CheckpointReader reader(dir.file("ckpt/step_00000030"));
  const auto saved = reader.params("master");
  ASSERT_EQ(saved.size(), 32u);
  for (const auto& [name, shape] : saved) EXPECT_NE(name.find(".lora_"), std::string::npos) << name;
  EXPECT_EQ(reader.manifest()
                .component("lora")
                ->state.at("base")
                .at("checksum")
                .get<std::string>()
                .size(),
            8u);

  // The run's own adapter directory and `export --adapter-only` agree exactly.
  const std::string run_adapter = dir.file("run/lora_adapter");
  const auto config = nlohmann::json::parse(read_text(run_adapter + "/adapter_config.json"));
  EXPECT_EQ(config.at("r"), 16);
  EXPECT_EQ(config.at("lora_alpha"), 32);
  EXPECT_EQ(config.at("peft_type"), "LORA");
  r = run_dstrain(
      {"export", dir.file("ckpt/latest"), "--adapter-only", "--out", dir.file("adapter")}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const lora::Adapter a = lora::read_adapter(run_adapter);
  const lora::Adapter b = lora::read_adapter(dir.file("adapter"));
  ASSERT_EQ(a.weights.size(), b.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) {
    EXPECT_TRUE(torch::equal(a.weights[i].A, b.weights[i].A)) << a.weights[i].module;
    EXPECT_TRUE(torch::equal(a.weights[i].B, b.weights[i].B)) << a.weights[i].module;
  }

  r = run_dstrain({"export", dir.file("ckpt/latest"), "--merge-lora", "--dtype", "float32", "--out",
                   dir.file("merged")},
                  {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  expect_merged_is_base_plus_delta(dir.file("merged"), run_adapter);

  r = run_dstrain({"export", dir.file("ckpt/latest"), "--out", dir.file("plain")}, {}, 120);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--adapter-only"), std::string::npos) << r.err;

  // A new run continues from the exported adapter: its first loss is the trained one, not the
  // untrained base's.
  TempDir next;
  JobSpec cont = spec;
  cont.max_steps = 2;
  cont.save_final = false;
  const std::string cfg2 = write_lora_job(next, cont);
  r = launch_job(cfg2, 2, {"lora.init_from=" + dir.file("adapter"), "training.lr=1e-9"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto cont_loss = read_metric(next.file("run/metrics.jsonl"), "train/loss");
  ASSERT_FALSE(cont_loss.empty());
  EXPECT_LT(cont_loss.at(1), loss.at(1) - 0.3);
  EXPECT_NEAR(cont_loss.at(1), mean_of_last(loss, 5), 0.3);
}

// ZeRO-3 with LoRA: the frozen base is sharded over the ranks and gathered per layer, the adapters
// train as at stage 0 on one process (with and without activation checkpointing), and the base
// checksum (computed by the ranks together from their slices) is the one a whole-model run
// computes.
TEST(LoraTrain, Stage3ShardsTheFrozenBaseAndTrainsAsStage0) {
  std::map<int, std::map<long, double>> losses;
  std::map<int, std::string> checksums;
  // 0: stage 0 on one rank; 3: stage 3 on two; 4: stage 3 on two with activation checkpointing.
  for (const int run : {0, 3, 4}) {
    const int stage = run == 0 ? 0 : 3;
    TempDir dir;
    JobSpec spec;
    spec.nproc = stage == 3 ? 2 : 1;
    spec.stage = stage;
    spec.micro = stage == 3 ? 2 : 4;
    spec.max_steps = 12;
    spec.save_final = true;
    const std::string cfg = write_lora_job(dir, spec);
    // No dropout: its masks are keyed by the samples a rank holds, which differ between world
    // sizes.
    const RunResult r = launch_job(
        cfg, spec.nproc,
        {"training.lr=1e-2", "lora.dropout=0", "zero.stage3_param_persistence_threshold=1000",
         std::string("model.gradient_checkpointing=") + (run == 4 ? "true" : "false")});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    losses[run] = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
    ckpt::CheckpointReader reader(dir.file("ckpt/step_00000012"));
    checksums[run] =
        reader.manifest().component("lora")->state.at("base").at("checksum").get<std::string>();
    const auto saved = reader.params("master");
    EXPECT_EQ(saved.size(), 32u) << "adapters only";
    EXPECT_TRUE(stdfs::exists(dir.file("run/lora_adapter/adapter_model.safetensors")));
  }
  ASSERT_EQ(losses[0].size(), 12u);
  ASSERT_EQ(losses[3].size(), 12u);
  ASSERT_EQ(losses[4].size(), 12u);
  for (const auto& [step, loss] : losses[0]) {
    EXPECT_NEAR(losses[3].at(step), loss, 1e-5 * std::max(1.0, std::abs(loss))) << "step " << step;
    EXPECT_NEAR(losses[4].at(step), loss, 1e-5 * std::max(1.0, std::abs(loss))) << "step " << step;
  }
  EXPECT_LT(losses[3].at(12), losses[3].at(1) - 0.1) << "LoRA at stage 3 did not learn";
  EXPECT_EQ(checksums[3], checksums[0]);
  EXPECT_EQ(checksums[4], checksums[0]);
}

// The long-sequence memory features under ZeRO-3 with adapters on every projection, the MLP's
// included: the tiled MLP (5-token tiles) takes each adapter gradient with respect to the tensors
// the engine gathers, and the offloaded layer inputs come back for the recompute; the losses are
// those of stage 0 on one process with neither.
TEST(LoraTrain, Stage3WithTiledMlpAndOffloadedCheckpointsTrainsAsStage0) {
  std::map<int, std::map<long, double>> losses;
  for (const int stage : {0, 3}) {
    TempDir dir;
    JobSpec spec;
    spec.nproc = stage == 3 ? 2 : 1;
    spec.stage = stage;
    spec.micro = stage == 3 ? 2 : 4;
    spec.max_steps = 8;
    const std::string cfg = write_lora_job(dir, spec);
    std::vector<std::string> sets = {"training.lr=1e-2", "lora.dropout=0",
                                     "lora.target_modules=all-linear",
                                     "zero.stage3_param_persistence_threshold=1000"};
    if (stage == 3) {
      sets.push_back("model.gradient_checkpointing=offload");
      sets.push_back("model.tiled_mlp=5");
    }
    const RunResult r = launch_job(cfg, spec.nproc, sets);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    losses[stage] = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  }
  ASSERT_EQ(losses[0].size(), 8u);
  ASSERT_EQ(losses[3].size(), 8u);
  for (const auto& [step, loss] : losses[0]) {
    EXPECT_NEAR(losses[3].at(step), loss, 1e-5 * std::max(1.0, std::abs(loss))) << "step " << step;
  }
  EXPECT_LT(losses[3].at(8), losses[3].at(1) - 0.05) << "did not learn";
}

TEST(LoraTrain, ResumeContinuesBitIdenticallyAndRefusesAnotherBase) {
  TempDir dir;
  const std::string cfg = write_lora_job(dir, resumable_job());
  RunResult r = launch_job(cfg, 2);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string metrics = dir.file("run/metrics.jsonl");
  const auto full = read_metric(metrics, "train/loss");
  ASSERT_EQ(full.size(), 20u);
  stdfs::rename(metrics, dir.file("full.jsonl"));

  // Dropout draws random numbers: a second run of the same config must still repeat the first.
  r = launch_job(cfg, 2, {"logging.out_dir=" + dir.file("again"), "checkpoint.interval=0"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(read_metric(dir.file("again/metrics.jsonl"), "train/loss"), full);

  r = run_dstrain({"resume", dir.file("ckpt/step_00000010")}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto resumed = read_metric(metrics, "train/loss");
  ASSERT_EQ(resumed.size(), 10u);
  expect_same_losses_after(10, resumed, full);

  // Another seed with init: random is another base model.
  r = run_dstrain({"resume", dir.file("ckpt/step_00000010"), "--set", "training.seed=8"}, {}, 120);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("checksum"), std::string::npos) << r.out << r.err;
}

// A pretrained base (Hugging Face files): the checkpoint refers to it by checksum, so replacing the
// files is caught by resume and by export --merge-lora alike.
TEST(LoraTrain, PretrainedBaseThatChangedIsRefusedOnResumeAndMerge) {
  TempDir dir;
  const std::string base_dir = dir.file("base");
  model::save_weights(*model::build_model(tiny_config(), torch::kFloat, 3), base_dir,
                      torch::kFloat);
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 1;
  spec.max_steps = 6;
  spec.checkpoint_interval = 3;
  const std::string cfg = write_lora_job(dir, spec);
  const std::vector<std::string> base = {"model.name_or_path=" + base_dir, "model.init=pretrained"};
  RunResult r = launch_job(cfg, 2, base);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = run_dstrain({"export", dir.file("ckpt/latest"), "--merge-lora", "--out", dir.file("merged")},
                  {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  model::save_weights(*model::build_model(tiny_config(), torch::kFloat, 4), base_dir,
                      torch::kFloat);
  r = run_dstrain({"resume", dir.file("ckpt/step_00000003")}, {}, 120);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("resume with the same base model"), std::string::npos)
      << r.out << r.err;
  r = run_dstrain({"export", dir.file("ckpt/latest"), "--merge-lora", "--out", dir.file("merged2")},
                  {}, 120);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("use the same base model"), std::string::npos) << r.err;
}

TEST(LoraTrain, UnknownTargetModuleIsAConfigErrorListingTheModules) {
  TempDir dir;
  JobSpec spec;
  const std::string cfg = write_lora_job(dir, spec);
  const RunResult r = launch_job(cfg, 1, {"lora.target_modules=[q_proj,c_attn]"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  const std::string all = r.out + r.err;
  EXPECT_NE(all.find("'c_attn' matches no module"), std::string::npos) << all;
  EXPECT_NE(all.find("q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"),
            std::string::npos)
      << all;
}

}  // namespace
}  // namespace dstrain::testing
