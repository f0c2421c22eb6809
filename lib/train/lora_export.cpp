#include "train/lora_export.h"

#include <torch/torch.h>

#include "core/error.h"
#include "core/log.h"
#include "lora/adapter_io.h"
#include "model/weights.h"
#include "train/lora_setup.h"

namespace dstrain::train {
namespace {

std::vector<lora::LoraWeights> read_lora_weights(const ckpt::CheckpointReader& reader,
                                                 const nlohmann::json& lora) {
  std::vector<lora::LoraWeights> out;
  for (const auto& module : lora.at("modules").get<std::vector<std::string>>()) {
    out.push_back({module,
                   reader.read_full("master", lora::lora_a_name(module)),
                   reader.read_full("master", lora::lora_b_name(module)),
                   {}});
  }
  // Absent in checkpoints written before modules_to_save.
  for (const auto& module : lora.value("whole_modules", std::vector<std::string>{})) {
    out.push_back({module, {}, {}, reader.read_full("master", lora::whole_name(module))});
  }
  return out;
}

}  // namespace

void export_lora(const ExportOptions& options, const ckpt::CheckpointReader& reader,
                 const model::ModelConfig& config) {
  const ckpt::Manifest& m = reader.manifest();
  const ckpt::ComponentRecord* lora_state = m.component("lora");
  if (lora_state == nullptr) {
    fail(ErrorKind::kUsage,
         "export: {} is a full fine-tuning checkpoint; --adapter-only and --merge-lora apply to "
         "LoRA checkpoints only",
         reader.dir());
  }
  if (options.adapter_only == options.merge_lora) {
    fail(ErrorKind::kUsage,
         "export: {} holds a LoRA adapter; give --adapter-only (a PEFT adapter directory) or "
         "--merge-lora (the merged model)",
         reader.dir());
  }
  const nlohmann::json& lj = lora_state->state;
  lora::Adapter adapter;
  adapter.options = lora_options_from_json(lj);
  adapter.base_model = lj.at("base").at("name_or_path").get<std::string>();
  adapter.weights = read_lora_weights(reader, lj);
  if (options.adapter_only) {
    const torch::ScalarType dtype =
        options.dtype == "auto" ? torch::kFloat : model::resolve_dtype(options.dtype, config);
    lora::write_adapter(options.out_dir, adapter, dtype);
    log::info("wrote the PEFT adapter ({} modules, r={}) to {}", adapter.weights.size(),
              adapter.options.r, options.out_dir);
    return;
  }
  const torch::ScalarType dtype =
      model::resolve_dtype(options.dtype == "auto" ? m.compute_dtype : options.dtype, config);
  model::DecoderModel base = rebuild_base_model(config, lj, reader.dir());
  lora::merge_lora(*base, adapter.weights, adapter.options);
  model::save_weights(*base, options.out_dir, dtype);
  log::info("merged {} LoRA modules into the base model", adapter.weights.size());
}

}  // namespace dstrain::train
