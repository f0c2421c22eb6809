#pragma once
// LoRA's own options (the `lora:` config section, mapped by lib/train), and PEFT's scale rule.

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::lora {

struct LoraOptions {
  int64_t r = 8;
  double alpha = 16;
  double dropout = 0.0;  // on the adapter's input, in training only
  // PEFT semantics (see targets.h): a list of module names matched as suffixes of the dotted module
  // path, or, when `target_regex`, one regular expression matched against the whole path.
  std::vector<std::string> target_modules = {"q_proj", "v_proj"};
  bool target_regex = false;
  // PEFT's target_parameters: expert stacks ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
  // matched as dotted-path suffixes of the parameter's name (targets.h).
  std::vector<std::string> target_parameters;
  // PEFT's modules_to_save: modules trained whole beside the adapters, selected by a plain suffix
  // match of their path (targets.h); a MoE layer's routers only.
  std::vector<std::string> modules_to_save;
  bool use_rslora = false;       // scale alpha/sqrt(r) instead of alpha/r
  std::string init = "default";  // default: A kaiming-uniform(a=sqrt(5)), B zero | gaussian
  uint64_t seed = 0;             // A's initial values depend on this seed only

  // ΔW = B·A·scale().
  double scale() const {
    return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
  }
};

}  // namespace dstrain::lora
