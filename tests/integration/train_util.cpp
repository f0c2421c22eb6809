#include "tests/integration/train_util.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace dstrain::testing {

std::string write_job_config(const std::string& dir, const JobSpec& s) {
  const std::string src = DSTRAIN_SOURCE_DIR;
  const std::string yaml = fmt::format(
      R"(model:
  name_or_path: {src}/configs/models/tiny
  init: random
  tokenizer: byte
data:
  train_path: {src}/configs/data/tiny_corpus.txt
  document: line
  max_length: {max_length}
  eval_split: 0.05
training:
  max_steps: {max_steps}
  per_device_train_batch_size: {micro}
  gradient_accumulation_steps: {accum}
  lr: 3.0e-3
  weight_decay: 0.01
  lr_scheduler: cosine
  warmup_ratio: 0.1
  gradient_clipping: {clip}
  seed: 7
  log_interval: 1
  eval_max_batches: 2
zero:
  stage: {stage}
logging:
  out_dir: {dir}/run
  progress: false
checkpoint:
  dir: {dir}/ckpt
  interval: {interval}
  save_final: {save_final}
)",
      fmt::arg("src", src), fmt::arg("dir", dir), fmt::arg("max_length", s.max_length),
      fmt::arg("max_steps", s.max_steps), fmt::arg("micro", s.micro), fmt::arg("accum", s.accum),
      fmt::arg("clip", s.clip), fmt::arg("stage", s.stage),
      fmt::arg("interval", s.checkpoint_interval), fmt::arg("save_final", s.save_final));
  const std::string path = dir + "/run.yaml";
  std::ofstream(path) << yaml;
  return path;
}

JobSpec resumable_job() {
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 2;
  spec.accum = 2;
  spec.clip = 1.0;
  spec.checkpoint_interval = 10;
  return spec;
}

void expect_same_losses_after(long from, const std::map<long, double>& resumed,
                              const std::map<long, double>& full) {
  for (const auto& [step, loss] : resumed) {
    ASSERT_GT(step, from);
    ASSERT_EQ(full.count(step), 1u) << "step " << step << " is not in the full run";
    EXPECT_EQ(loss, full.at(step)) << "step " << step << " differs after resume";
  }
}

RunResult launch_job(const std::string& config, int nproc,
                     const std::vector<std::string>& overrides, double timeout_s) {
  std::vector<std::string> args = {"launch", "--nproc", std::to_string(nproc), config};
  for (const auto& o : overrides) {
    args.push_back("--set");
    args.push_back(o);
  }
  return run_dstrain(args, {}, timeout_s);
}

RunResult run_job(const TempDir& dir, const JobSpec& spec,
                  const std::vector<std::string>& overrides, double timeout_s) {
  std::vector<std::string> all = spec.extra_overrides;
  all.insert(all.end(), overrides.begin(), overrides.end());
  return launch_job(write_job_config(dir.path(), spec), spec.nproc, all, timeout_s);
}

Curves run_curves(int nproc, int stage, int accum, const std::vector<std::string>& extra,
                  const std::function<void(const TempDir&)>& inspect, int steps) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = nproc;
  spec.stage = stage;
  spec.accum = accum;
  spec.clip = 1.0;
  spec.max_steps = steps;
  spec.extra_overrides = {"zero.stage3_param_persistence_threshold=1000"};
  spec.extra_overrides.insert(spec.extra_overrides.end(), extra.begin(), extra.end());
  const RunResult r = run_job(dir, spec);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string metrics = dir.file("run/metrics.jsonl");
  if (inspect) inspect(dir);
  return {read_metric(metrics, "train/loss"), read_metric(metrics, "grad_norm"),
          read_metric(metrics, "eval/loss")};
}

void expect_same_curve(const std::map<long, double>& got, const std::map<long, double>& want,
                       double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [step, value] : want) {
    ASSERT_TRUE(got.count(step)) << what << " step " << step;
    EXPECT_NEAR(got.at(step), value, tol * std::abs(value)) << what << " step " << step;
  }
}

std::map<long, double> read_metric(const std::string& metrics_path, const std::string& key) {
  std::map<long, double> out;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains(key) || !j[key].is_number()) continue;
    out[j["step"].get<long>()] = j[key].get<double>();
  }
  return out;
}

std::string quick_start_block(const std::string& name) {
  const std::string page = read_text(DSTRAIN_SOURCE_DIR "/docs/quickstart-gpu.md");
  const std::string start = "cat > " + name + " <<'EOF'\n";
  const size_t b = page.find(start);
  if (b == std::string::npos) return "";
  const size_t e = page.find("\nEOF\n", b);
  return page.substr(b + start.size(), e - b - start.size() + 1);
}

void write_quick_start_data(const std::string& dir) {
  std::filesystem::create_directories(dir + "/data");
  std::ifstream corpus(DSTRAIN_SOURCE_DIR "/configs/data/tiny_corpus.txt");
  std::ofstream train(dir + "/data/train.txt");
  std::string line;
  for (int i = 0; i < 520 && std::getline(corpus, line); ++i) train << line << "\n";
}

}  // namespace dstrain::testing
