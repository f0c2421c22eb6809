#pragma once
// The Hub's names of a MoE model's expert weights. The model holds each layer's experts as two
// stacks under transformers 5's names (moe.h): mlp.experts.gate_up_proj [E, 2I, C] and
// mlp.experts.down_proj [E, C, I]. The Hub's files hold one tensor per expert and projection —
// Qwen: mlp.experts.N.{gate,up,down}_proj.weight; Mixtral: block_sparse_moe.experts.N.{w1,w3,w2}
// .weight (gate, up, down) and its router as block_sparse_moe.gate.weight — which transformers 5
// merges when it loads and splits again when it saves. dstrain reads either layout and writes the
// Hub's.
//
// Each such tensor is a contiguous run of its stack's elements (expert e's gate rows, then its up
// rows; its down matrix), so a range of a stack's elements is read piece by piece.

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "model/model_config.h"

namespace dstrain::model {

class SafetensorsSet;

// A tensor of the Hub's layout holding elements [offset, offset + its numel) of a parameter.
struct HubPiece {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
};

// The Hub's tensors of parameter `name` (of `shape`) of `config`'s model, in order; empty when the
// Hub stores it under its own name.
std::vector<HubPiece> hub_pieces(const ModelConfig& config, const std::string& name,
                                 const std::vector<int64_t>& shape);

// Elements [begin, end) of parameter `name` (of `shape`) flattened, from `files`: its own tensor
// when they hold it, else its Hub pieces'. float of the file's dtype, on the CPU.
torch::Tensor read_parameter(const SafetensorsSet& files, const ModelConfig& config,
                             const std::string& name, const std::vector<int64_t>& shape,
                             int64_t begin, int64_t end);

}  // namespace dstrain::model
