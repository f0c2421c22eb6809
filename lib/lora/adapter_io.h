#pragma once
// PEFT LoRA adapter directories, read and written:
//   adapter_config.json         {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r", "lora_alpha",
//                                "lora_dropout", "target_modules", "target_parameters",
//                                "bias": "none",
//                                "base_model_name_or_path", "use_rslora", "fan_in_fan_out": false,
//                                "inference_mode": true, "modules_to_save": null, ...}
//   adapter_model.safetensors   base_model.model.<module>.lora_A.weight  [r, in]
//                               base_model.model.<module>.lora_B.weight  [out, r]
//                               (an expert stack's [r·E, in] and [out, r·E]: lora_model.h)
// with ΔW = B·A·lora_alpha/r (rsLoRA: /√r). This is what PEFT's save_pretrained writes and what
// PEFT's from_pretrained and vLLM's LoRA loader read. `target_modules` is written as a list of
// names, or as one string when it is a regex (PEFT's two forms).
//
// Reading accepts the tensor names with or without PEFT's adapter-name infix
// (`...lora_A.default.weight`), target_modules as a list or a string (a regex, or "all-linear"),
// target_parameters (expert stacks, targets.h) and modules_to_save (routers trained whole, stored
// as base_model.model.<module>.weight) as lists or null. Error(kInput) naming the file and key for
// anything this build cannot use: another peft_type, bias other than "none", a set PEFT option
// that changes which modules are adapted or what they compute (DoRA, rank_pattern/alpha_pattern,
// exclude_modules, layers_to_transform, layer_replication, lora_bias, trainable_token_indices,
// aLoRA, QA-LoRA, BD-LoRA, Arrow, KaSA, MonteCLoRA), an init_lora_weights that rewrites the base
// (PiSSA, OLoRA, CorDA, LoftQ, LoRA-GA) or is a variant (MiCA), a tensor that is not
// lora_A/lora_B or a modules_to_save weight, a module with only one of the two, or inconsistent
// shapes.

#include <filesystem>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "lora/lora_model.h"
#include "lora/options.h"

namespace dstrain::lora {

inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

struct Adapter {
  LoraOptions options;  // r, alpha, dropout, target_modules (+ regex form), target_parameters, ...
  std::string base_model;  // base_model_name_or_path
  std::vector<LoraWeights> weights;
};

// Writes both files atomically into `dir` (created if needed), tensors cast to `dtype`.
void write_adapter(const std::filesystem::path& dir, const Adapter& adapter,
                   torch::ScalarType dtype = torch::kFloat);

// Reads an adapter directory; tensors keep their stored dtype; the modules_to_save weights, then
// the adapted modules sorted by path.
Adapter read_adapter(const std::filesystem::path& dir);

}  // namespace dstrain::lora
