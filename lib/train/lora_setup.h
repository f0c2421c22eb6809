#pragma once
// LoRA's part of the run config and of checkpoints, shared by the trainer and `dstrain export`.
//
// A LoRA checkpoint's manifest carries, under "lora":
//   {"r", "alpha", "dropout", "target_modules", "target_regex", "target_parameters",
//    "modules_to_save", "use_rslora", "init",
//    "modules": [adapted module paths], "whole_modules": [modules trained whole],
//    "base": {"name_or_path", "dir", "init": "pretrained"|"random", "seed", "checksum"}}
// The shards hold only the adapters' pieces and the weights trained whole (master and optimizer
// state); the base weights are referenced, never stored: "checksum" (lora/base_checksum.h, over
// the float32 base) is verified whenever the base is rebuilt, on resume and on export --merge-lora.

#include <string>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "lora/adapter_io.h"
#include "lora/options.h"
#include "model/model.h"
#include "train/parallelize.h"

namespace dstrain::train {

// lora: section → LoraOptions (seed = training.seed). The config loader has already refused a
// bias other than none.
lora::LoraOptions lora_options(const config::Config& c);

// lora.init_from: the adapter decides r, alpha, target_modules and use_rslora (its tensors have
// those shapes); dropout, init and seed stay the config's. Each value the config sets otherwise is
// logged as a warning.
lora::LoraOptions options_from_adapter(const lora::LoraOptions& from_config,
                                       const lora::Adapter& adapter, const std::string& source);

// What parallelize() adds for the lora: section: its options and, with lora.init_from, the
// adapter's (options_from_adapter) and its weights to start from.
LoraPlan lora_plan(const config::Config& c);

nlohmann::json lora_options_json(const lora::LoraOptions& o);
lora::LoraOptions lora_options_from_json(const nlohmann::json& j);

// The base model a LoRA manifest refers to, rebuilt in float32 (pretrained weights from its
// directory, or the random init of its seed), after checking its checksum: Error(kInput) naming
// both checksums when the base differs from the one the adapter was trained on.
model::DecoderModel rebuild_base_model(const model::ModelConfig& config, const nlohmann::json& lora,
                                       const std::string& checkpoint);

}  // namespace dstrain::train
