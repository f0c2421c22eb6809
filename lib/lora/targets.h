#pragma once
// Which projections of a DecoderModel carry an adapter, chosen as PEFT chooses them.
//
// Module paths are the dotted names of named_modules(), e.g. "model.layers.3.self_attn.q_proj".
// PEFT's rule: a list of names selects a module when its path equals a name or ends with "." + name
// ("q_proj", "self_attn.q_proj"); a single string is a regular expression that must match the
// whole path (Python's re.fullmatch). The config turns a single string into a one-element list, so
// a one-element list whose entry holds a regex metacharacter (one of `*+?()[]{}|^$\`, none of
// which occur in module names) is taken as the regex form; see is_regex_target().
//
// PEFT's shorthand "all-linear" (the string alone, or a one-element list) selects every linear
// layer but the output layer: here, every targetable projection. PEFT writes the names it expanded
// to into adapter_config.json; LoraModel does the same (see expand_all_linear()).
//
// The projections that can carry an adapter are those the model's blocks offer
// (model::Block::projections(): a decoder layer's q_proj k_proj v_proj o_proj gate_proj up_proj
// down_proj), at the path block name + "." + the projection's path in the block. A target that
// selects nothing, or selects another kind of module (a norm, an embedding, lm_head), is
// Error(kConfig) listing the names that can be targeted. Matching reads only the block list and
// module names, so it works on a model built without memory (model::Materialize::kNo).

// Expert stacks ([E, out, in] parameters of a MoE layer's experts) are chosen as PEFT's
// target_parameters chooses them: a name selects the parameter whose dotted name
// ("model.layers.1.mlp.experts.gate_up_proj") equals it or ends with "." + name. PEFT wraps the
// experts module once per selected stack, in the module's parameter order, each wrapper around the
// last: the last selected stack's adapter is at the module's path, an earlier one's at
// ".base_layer" deeper per later one (both of a Qwen3-MoE layer's stacks: gate_up_proj at
// "model.layers.1.mlp.experts.base_layer", down_proj at "model.layers.1.mlp.experts"). A
// TargetModule's path for a stack is that one, the module of its tensors' names in PEFT's files.

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace dstrain::lora {

struct TargetModule {
  std::string path;        // "model.layers.0.self_attn.q_proj"
  std::string projection;  // "q_proj"
  size_t block = 0;        // the model block it belongs to (model::ModelBlock::index)
  int64_t in_features = 0;
  int64_t out_features = 0;
  model::Linear linear{nullptr};  // the projection (its adapter slot: LinearImpl::adapter)
  torch::Tensor weight;           // the projection's weight [out, in]; an expert stack [E, out, in]
  // An expert stack (then `linear` is null and in/out_features are one expert's): the experts
  // module holding it, the stack's name ("gate_up_proj" or "down_proj") and the number of experts.
  model::Experts experts{nullptr};
  std::string parameter;
  int64_t num_experts = 0;
  bool is_stack() const { return num_experts > 0; }
  // A module trained whole (modules_to_save; `linear` is it): a trained copy of its weight.
  bool whole = false;
};

// Every projection that can carry an adapter, in forward order (block by block; in a decoder
// layer q k v o, then gate up down).
std::vector<TargetModule> targetable_modules(model::DecoderModelImpl& model);

// The projection names of targetable modules, for error messages: "q_proj, k_proj, ...".
std::string targetable_names(model::DecoderModelImpl& model);

inline constexpr const char* kAllLinear = "all-linear";

// True when `targets` is the regex form (see above); "all-linear" is not.
bool is_regex_target(const std::vector<std::string>& targets);

// True when `targets` is {"all-linear"}.
bool is_all_linear(const std::vector<std::string>& targets);

// {"all-linear"} → the projection names, in forward order ("q_proj", ..., "down_proj"); any other
// list is returned as it is.
std::vector<std::string> expand_all_linear(model::DecoderModelImpl& model,
                                           const std::vector<std::string>& targets);

// PEFT's match of one module path against `targets` (`regex`: targets[0] is a full-match regex).
bool target_matches(const std::vector<std::string>& targets, bool regex, const std::string& path);

// The targetable modules selected by `targets`, in forward order. Error(kConfig) naming `key` (the
// config key, e.g. "train.yaml: lora.target_modules") when a name selects no module, when the regex
// is invalid or selects nothing, or when a selected module cannot carry an adapter.
std::vector<TargetModule> resolve_targets(model::DecoderModelImpl& model,
                                          const std::vector<std::string>& targets, bool regex,
                                          const std::string& key);

// The expert stacks selected by `targets` (target_parameters), in forward order, with PEFT's paths
// (above). Empty for an empty list. Error(kConfig) naming `key` when a name selects no parameter
// or selects one that is not an expert stack.
std::vector<TargetModule> resolve_parameters(model::DecoderModelImpl& model,
                                             const std::vector<std::string>& targets,
                                             const std::string& key);

// The routing projections selected by PEFT's modules_to_save `names` (model::Block::routers()),
// in forward order. PEFT selects a module whose path ends with a name, without a dot: "gate"
// selects each MoE layer's mlp.gate and Qwen2-MoE's mlp.shared_expert_gate. Empty for an empty
// list. Error(kConfig) naming `key` when a name selects nothing or selects another module.
std::vector<TargetModule> resolve_whole(model::DecoderModelImpl& model,
                                        const std::vector<std::string>& names,
                                        const std::string& key);

}  // namespace dstrain::lora
