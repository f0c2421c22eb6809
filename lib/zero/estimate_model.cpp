// Parameter shapes of a decoder model from its config.json, and the estimate input of a run.
#include "zero/estimate.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "core/error.h"
#include "hub/resolve.h"
#include "model/model.h"
#include "zero/estimate_activations.h"

namespace dstrain::zero {
namespace {

// The loaded config of per_device_train_batch_size: auto holds micro-batch 1 (config.h): say so
// rather than let the table pass for the run's.
std::string auto_micro_batch_note(const config::TrainingSection& t) {
  if (!t.micro_batch_auto) return "";
  return fmt::format(
      "\nNote: training.per_device_train_batch_size is auto: the activations above are per "
      "micro-batch of {}; the run picks the largest micro-batch of its {} samples per rank that "
      "fits when it starts (docs/training.md, Micro-batch auto).\n",
      t.per_device_train_batch_size, t.per_device_train_batch_size * t.gradient_accumulation_steps);
}

}  // namespace

// The model's own block list, from a model built without memory (it allocates and draws nothing,
// so a 70B config takes milliseconds).
std::vector<ParamShape> parameter_shapes(const model::ModelConfig& c) {
  const model::DecoderModel m(c, model::Materialize::kNo);
  std::vector<ParamShape> out;
  for (const auto& block : m->blocks()) {
    for (const auto& [name, tensor] : block->parameters) {
      out.push_back({name, tensor.numel(), static_cast<int>(block->index)});
    }
  }
  return out;
}

EstimateInput estimate_input(const config::Config& config, const model::ModelConfig& model,
                             int world_size) {
  EstimateInput in;
  in.params = parameter_shapes(model);
  in.world_size = world_size;
  in.compute_bytes = config.training.bf16 || config.training.fp16 ? 2 : 4;
  const auto& opt = config.training.optimizer;
  in.optimizer_bytes = opt.type == "sgd" ? (opt.momentum != 0 ? 4 : 0) : 8;
  in.param_persistence_threshold = config.zero.stage3_param_persistence_threshold;
  return in;
}

int64_t model_states_bytes(const config::Config& config, const model::ModelConfig& model,
                           int world_size) {
  return estimate_row(estimate_input(config, model, world_size),
                      static_cast<int>(config.zero.stage),
                      config.zero.offload_optimizer.device == "cpu",
                      config.zero.offload_param.device == "cpu")
      .device();
}

std::string estimate_report(const std::string& config_path,
                            const std::vector<std::string>& overrides, int world_size, bool json) {
  if (world_size < 1)
    fail(ErrorKind::kUsage, "estimate: the world size is {}; expected >= 1", world_size);
  config::LoadOptions load;
  load.overrides = overrides;
  load.world_size = world_size;
  const config::Config config = config::load_config(config_path, load);
  // Only config.json is read: a hub id not cached is fetched without its weights.
  const auto dir =
      hub::resolve_model_dir({config.model.name_or_path, config.model.revision, /*weights=*/false});
  const model::ModelConfig model = model::load_model_config(dir);
  const EstimateInput in = estimate_input(config, model, world_size);
  // The ranks are GPUs: activations as the fused kernels keep them (estimate_activations.h).
  const ActivationInput activations = activation_input(config, model, /*cuda=*/true);
  if (!json) {
    return format_estimate(in, dir.string()) + "\n" + format_activations(activations) +
           auto_micro_batch_note(config.training);
  }
  nlohmann::json out = nlohmann::json::parse(format_estimate_json(in, dir.string()));
  out["activations"] = activations_json(activations);
  return out.dump(2) + "\n";
}

}  // namespace dstrain::zero
