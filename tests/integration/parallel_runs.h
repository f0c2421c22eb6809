#pragma once
// What the tensor- and pipeline-parallel end-to-end tests share: a variant of the tiny model, and
// a 20-step run's curves with the LoRA adapter it wrote.

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
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

}  // namespace dstrain::testing
