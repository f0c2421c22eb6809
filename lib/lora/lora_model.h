#pragma once
// LoRA on a DecoderModel: y = W·x + B·A·dropout(x)·scale for each targeted projection, with
//   A [r, in]  (lora_A.weight)   B [out, r]  (lora_B.weight)   scale = alpha/r (rsLoRA: alpha/√r)
// as PEFT defines it, so ΔW = B·A·scale. On an expert stack [E, out, in] (lora.target_parameters,
// PEFT's ParamWrapper) each expert e has its own ΔW_e = B_e·A_e·scale, held as A [r·E, in] and
// B [out, r·E] in PEFT's layout (lora_model.cpp).
//
// The adapters live beside the model, not inside it: the model's named_parameters() stay the
// Hugging Face base weights, and LoraModel::named_parameters() are the only trainable tensors.
// A and B are created float32 on the CPU: A from `seed` (default: kaiming-uniform with a=√5, i.e.
// U(-1/√in, 1/√in); gaussian: N(0, (1/r)²)), drawn module by module in the order of modules()
// from a generator of its own (the global RNG is not touched), and B = 0, so the adapted model
// starts equal to the base. Callers may move A and B into other storage (set_data, as the ZeRO
// engine does): the adapters keep using the same tensor objects.
//
// Lifetime: the LoraModel must outlive every forward of the model; its destructor removes the
// adapters from the model.
//
// On a tensor-parallel model (model/tensor_parallel.h) each rank holds the slices of A and B that
// match its projection's: a column-parallel projection's (q/k/v, gate/up) B by rows and A whole, a
// row-parallel one's (o_proj, down_proj) A by columns and B whole (their placements, from the
// projection's: BlockParameter::placement). A is
// drawn whole, as one rank draws it, and sliced; loaded weights are whole and sliced; the whole
// one of the two gets its gradient summed over the group (only its part is this rank's); dropout
// on a row-parallel projection's input draws the whole input's mask and takes this rank's
// columns, so a group whose ranks share the generator's state draws one rank's masks (the
// trainer seeds it alike on them before every block: train/pipeline.h's MicroBatch::draws).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "lora/options.h"
#include "lora/targets.h"
#include "model/model.h"

namespace dstrain::lora {

// The two matrices of one adapted module, or the weight of a module trained whole.
struct LoraWeights {
  std::string module;  // module path, e.g. "model.layers.0.self_attn.q_proj"
  torch::Tensor A;     // [r, in]; an expert stack's [r·E, in]
  torch::Tensor B;     // [out, r]; an expert stack's [out, r·E]
  // modules_to_save: the module's trained weight [out, in], A and B undefined.
  torch::Tensor whole;
  bool is_whole() const { return whole.defined(); }
};

// Parameter names used for the trainable tensors (in checkpoints and the engine).
std::string lora_a_name(const std::string& module);  // "<module>.lora_A.weight"
std::string lora_b_name(const std::string& module);  // "<module>.lora_B.weight"
// A module trained whole: "<module>.modules_to_save.weight" (its base weight keeps its own name).
std::string whole_name(const std::string& module);

class LoraModel {
 public:
  // Resolves options.target_modules and target_parameters (Error(kConfig) as in targets.h, `key`
  // names the config file), creates and initialises A and B, and installs the adapters.
  // Error(kConfig) for an unknown init, all-linear on a MoE model, or dropout with expert stacks.
  LoraModel(model::DecoderModel model, LoraOptions options, const std::string& key);
  ~LoraModel();
  LoraModel(const LoraModel&) = delete;
  LoraModel& operator=(const LoraModel&) = delete;

  // The options given, with target_modules "all-linear" replaced by the projection names it
  // selected (what adapter_config.json records, as PEFT does).
  const LoraOptions& options() const { return options_; }
  // Adapted module paths, block by block (each block's projections in forward order, then its
  // expert stacks); then the modules trained whole (modules_to_save), in forward order.
  std::vector<std::string> modules() const;
  std::vector<std::string> whole_modules() const;
  // The adapted projections and stacks, and the modules trained whole, block by block (each with
  // the model block it belongs to).
  const std::vector<TargetModule>& targets() const { return targets_; }
  // (lora_A name, A), (lora_B name, B) per module, in forward order: the trainable parameters.
  std::vector<std::pair<std::string, torch::Tensor>> named_parameters() const;
  // The same, each with the model block its projection belongs to (model::ModelBlock::index)
  // and its placement over a tensor-parallel group (the class comment).
  struct BlockParameter {
    std::string name;
    torch::Tensor tensor;
    size_t block = 0;
    model::Placement placement{};
    // A module trained whole that was not loaded: the base weight its values start from.
    std::string starts_from;
  };
  std::vector<BlockParameter> block_parameters() const;
  std::vector<LoraWeights> weights() const;
  int64_t num_parameters() const;

  // Copies `from` into A and B and the weights trained whole (any dtype). Error(kInput) naming the
  // module when a module of this model is missing from `from`, `from` has a module this model does
  // not adapt or train, or a shape differs; `source` names where `from` came from.
  void load(const std::vector<LoraWeights>& from, const std::string& source);

 private:
  model::DecoderModel model_;
  LoraOptions options_;
  std::vector<TargetModule> targets_;
  // Per target: the A and B its adapter reads (the same tensor objects) and their placements;
  // for a module trained whole, its trained weight (LinearImpl::trained) and whether load() set it.
  struct Installed {
    torch::Tensor A, B;
    model::Placement a_placement, b_placement;
    torch::Tensor whole;
    bool loaded = false;
  };
  std::vector<Installed> installed_;
};

// W += B·A·scale for every module of `weights` (computed in float32, stored in W's dtype; an expert
// stack's W_e += B_e·A_e·scale, the layout of lora_model.cpp's ExpertsLoraAdapter), scale and the
// stacks' paths from `options`; a module trained whole gets its trained weight. Error(kInput) when
// a module is not a targetable projection, selected stack or router of `model` or a shape differs.
void merge_lora(model::DecoderModelImpl& model, const std::vector<LoraWeights>& weights,
                const LoraOptions& options);

}  // namespace dstrain::lora
