#pragma once
// Rotary position embedding (RoPE) in the Hugging Face "rotate-half" layout: a head vector x of
// size D is split into halves (x1, x2) and rotated as x·cos + (-x2, x1)·sin, where frequency i <
// D/2 drives both element i and element i + D/2. Frequencies are computed in float32 as HF does,
// then cast to the activation dtype, so the angles do not depend on the model dtype.

#include <torch/torch.h>

#include "model/model_config.h"

namespace dstrain::model {

// Inverse frequencies [head_dim / 2], float32: 1 / theta^(2i/D), then the config's scaling
// (linear: divided by factor; llama3: low frequencies divided by factor, a smooth blend in
// between).
torch::Tensor rope_inv_freq(const ModelConfig& config);

// cos and sin tables [T, head_dim] for positions 0..T-1, float32, on inv_freq's device.
std::pair<torch::Tensor, torch::Tensor> rope_tables(const torch::Tensor& inv_freq, int64_t seq_len);

// x: [B, heads, T, D]; cos, sin: [T, D] in x's dtype. Returns the rotated x, same shape.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin);

}  // namespace dstrain::model
