#pragma once
// What the tensor- and pipeline-parallel end-to-end tests share: a variant of the tiny model, a
// 20-step run's curves with the LoRA adapter it wrote, a checkpoint resumed at another layout and
// the comparison of two exports.

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "tests/integration/process_util.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {

// The tiny model's config.json with `changes`, written to <dir>/model; returns the override that
// trains it.
inline std::string write_model(const TempDir& dir, const nlohmann::json& changes) {
  std::ifstream in(std::string(DSTRAIN_SOURCE_DIR) + "/configs/models/tiny/config.json");
  nlohmann::json config = nlohmann::json::parse(in);
  config.update(changes);
  std::filesystem::create_directories(dir.file("model"));
  std::ofstream(dir.file("model/config.json")) << config.dump(2);
  return "model.name_or_path=" + dir.file("model");
}

// The curves of a run and the LoRA adapter it wrote at the end, if any.
struct RunOutput {
  Curves curves;
  std::map<std::string, torch::Tensor> adapter;
};

// The steps of every equality run.
constexpr int kSteps = 20;

// run_curves() over kSteps steps, keeping the adapter.
inline RunOutput run(int nproc, int stage, int accum, const std::vector<std::string>& extra) {
  RunOutput out;
  out.curves = run_curves(
      nproc, stage, accum, extra,
      [&](const TempDir& dir) {
        const std::string adapter = dir.file("run/lora_adapter/adapter_model.safetensors");
        if (!std::filesystem::exists(adapter)) return;
        const model::SafetensorsFile f(adapter);
        for (const std::string& name : f.names()) out.adapter[name] = f.read(name);
      },
      kSteps);
  return out;
}

// `dstrain resume CHECKPOINT --nproc N` with `sets` (key=value overrides), its output and new
// checkpoints in `out`; the losses it logged (empty after a failure, reported as `layout`'s).
inline std::map<long, double> resume_losses(const std::string& checkpoint, int nproc,
                                            const std::vector<std::string>& sets,
                                            const std::string& out, const std::string& layout) {
  std::vector<std::string> args = {"resume",  checkpoint,
                                   "--nproc", std::to_string(nproc),
                                   "--set",   "logging.out_dir=" + out,
                                   "--set",   "checkpoint.dir=" + out + "/ckpt"};
  for (const std::string& kv : sets) args.insert(args.end(), {"--set", kv});
  const RunResult r = run_dstrain(args, {}, 180);
  EXPECT_EQ(r.exit_code, 0) << layout << "\n" << r.out << r.err;
  if (r.exit_code != 0) return {};
  return read_metric(out + "/metrics.jsonl", "train/loss");
}

// Exports checkpoints `got` and `want` (into <dir>/got, <dir>/want) and expects the same tensors
// within 1e-4: AdamW's step hardly depends on a gradient's size, so an element whose gradient is
// near zero moves by up to the learning rate (3e-3) on rounding alone (measured: 1e-6); a slice
// out of place would differ by the weights themselves (initialised with std 0.02).
inline void expect_same_exports(const std::string& got, const std::string& want,
                                const TempDir& dir) {
  for (const auto& [from, to] : {std::pair{got, dir.file("got")}, {want, dir.file("want")}}) {
    const RunResult r = run_dstrain({"export", from, "--out", to}, {}, 120);
    ASSERT_EQ(r.exit_code, 0) << from << "\n" << r.out << r.err;
  }
  const model::SafetensorsFile a(dir.file("got/model.safetensors"));
  const model::SafetensorsFile b(dir.file("want/model.safetensors"));
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& name : b.names()) {
    const torch::Tensor x = a.read(name), y = b.read(name);
    ASSERT_EQ(x.sizes(), y.sizes()) << name;
    EXPECT_LT((x - y).abs().max().item<double>(), 1e-4) << name;
  }
}

// `dstrain launch` of `spec` (spec.nproc ranks, spec.extra_overrides as --set) hit by `signal` on
// rank `victim` once its first checkpoint is committed (spec.checkpoint_interval), with `env`
// added: what the launcher said and how long the job took to stop after the signal. Expects the
// job to stop with a failure before its 60 s and every process of it to be gone 10 s later.
struct RankHit {
  RunResult result;
  double seconds = 0;
};
inline RankHit hit_rank(const JobSpec& spec, int victim, int signal,
                        const std::vector<std::string>& env = {}) {
  TempDir dir;
  const std::string token = unique_token();
  std::vector<std::string> marked = env;
  marked.push_back("DSTRAIN_TEST_MARKER=" + token);
  std::vector<std::string> args = {"launch", "--nproc", std::to_string(spec.nproc),
                                   write_job_config(dir.path(), spec)};
  for (const std::string& kv : spec.extra_overrides) args.insert(args.end(), {"--set", kv});
  Child job = start_dstrain(args, marked);
  RankHit hit;
  EXPECT_TRUE(wait_until([&] { return file_exists(dir.file("ckpt/latest")); }, 120));
  pid_t pid = -1;
  EXPECT_TRUE(wait_until(
      [&] {
        pid = rank_pid(processes_with_marker(token), victim);
        return pid > 0;
      },
      20));
  const auto at = std::chrono::steady_clock::now();
  if (pid > 0) ::kill(pid, signal);
  hit.result = finish(job, 60);
  hit.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - at).count();
  EXPECT_FALSE(hit.result.timed_out);
  EXPECT_NE(hit.result.exit_code, 0);
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token).empty(); }, 10));
  return hit;
}

}  // namespace dstrain::testing
