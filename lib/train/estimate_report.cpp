// `dstrain estimate`: the memory model of a run config, without a device.
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "core/error.h"
#include "hub/resolve.h"
#include "train/run_plan.h"

namespace dstrain::train {
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
  // The ranks are GPUs: activations as the fused kernels keep them (estimate/activations.h).
  const RunMemory memory(config, model::load_model_config(dir), world_size, /*cuda=*/true);
  const estimate::EstimateInput in = memory.model_states_input();
  const estimate::ActivationInput activations = memory.activations();
  if (!json) {
    const int64_t T = config.parallel.tensor_parallel_size;
    const std::string slice =
        T == 1 ? ""
               : fmt::format(
                     "Tensor parallelism {}: each rank holds 1/{} of every layer, the embedding "
                     "and the head; below, one slice on the {} ranks that hold it.\n",
                     T, T, world_size / T);
    return slice + estimate::format_estimate(in, dir.string()) + "\n" +
           estimate::format_activations(activations) + auto_micro_batch_note(config.training);
  }
  nlohmann::json out = nlohmann::json::parse(estimate::format_estimate_json(in, dir.string()));
  out["activations"] = estimate::activations_json(activations);
  return out.dump(2) + "\n";
}

}  // namespace dstrain::train
