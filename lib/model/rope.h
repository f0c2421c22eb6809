#pragma once
// Rotary position embedding (RoPE) in the Hugging Face "rotate-half" layout: a head vector x of
// size D is split into halves (x1, x2) and rotated as x·cos + (-x2, x1)·sin, where frequency i <
// D/2 drives both element i and element i + D/2. Frequencies are computed in float32 with the
// same tensor operations as transformers' rope functions (modeling_rope_utils.py), then cast to
// the activation dtype, so the angles do not depend on the model dtype.

#include <torch/torch.h>

#include "model/model_config.h"

namespace dstrain::model {

// Inverse frequencies [head_dim / 2], float32, for a sequence of `seq_len` positions:
// 1 / theta^(2i/D), then the config's scaling:
//   linear   divided by factor
//   llama3   wavelengths longer than the original context / low_freq_factor divided by factor,
//            shorter than context / high_freq_factor kept, a smooth blend in between
//   yarn     frequencies that turn fewer than beta_slow times over the original context divided
//            by factor, more than beta_fast times kept, a linear ramp over the dimensions between
//   dynamic  (NTK) theta raised to theta·(factor·T/M − (factor−1))^(D/(D−2)) once the sequence
//            outgrows M = max_position_embeddings; unscaled up to M
// Only dynamic depends on seq_len. transformers' dynamic rope keeps the frequencies of the longest
// sequence it has seen (until one of at most M positions comes): for the first sequence, and for
// every sequence while lengths do not shrink (training at one max_length), the two agree.
torch::Tensor rope_inv_freq(const ModelConfig& config, int64_t seq_len);

// The factor cos and sin are multiplied by: yarn's attention factor (attention_factor, else from
// mscale/mscale_all_dim, else 0.1·ln(factor) + 1), 1 for every other type.
double rope_attention_scaling(const ModelConfig& config);

// cos and sin tables [T, head_dim] for positions 0..T-1, float32, on inv_freq's device, each
// multiplied by `scaling`.
std::pair<torch::Tensor, torch::Tensor> rope_tables(const torch::Tensor& inv_freq, int64_t seq_len,
                                                    double scaling = 1.0);

// x: [B, heads, T, D]; cos, sin: [T, D] in x's dtype. Returns the rotated x, same shape.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin);

}  // namespace dstrain::model
