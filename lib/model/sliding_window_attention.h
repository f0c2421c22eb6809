#pragma once
// Causal attention limited to a sliding window, as transformers' sliding-window layers compute it
// (Mistral, Qwen2/Qwen3 `sliding_attention` layers): query i attends to keys j with
// i - window < j <= i, itself and the window - 1 positions before it.
//
// Memory: never a [T, T] score matrix or mask. Queries go in tiles of `query_tile` rows; a tile
// [s, e) attends to the keys [s - window + 1, e) through scaled-dot-product attention with an
// additive band mask, a view of one [tile, tile + window - 1] mask shared by every tile (the band
// has the same shape relative to each tile's first key). SDPA's fused kernels that take a mask
// (flash on the CPU; memory-efficient on CUDA) keep a tile's scores in blocks; what lives
// between forward and backward is q, k, v, the output, the kernels' per-row statistics and the
// one mask: O(T) plus O(tile · window). Each tile computes tile + window - 1 keys per query
// where the band needs window, so a smaller tile wastes less work and a larger one makes fewer,
// larger kernel calls.
//
// Gradients: every tile is its own little graph over detached views of q, k, v, and backward
// adds each tile's dk, dv into the rows it read (in float32 for 16-bit inputs: a key gets
// contributions from up to 1 + ceil((window - 1) / tile) tiles). Differentiating the tiles
// through narrow() views of q, k, v instead would make every tile's backward write a full
// [B, H, T, D] zero-padded gradient: O(T² / tile) work.

#include <cstdint>

#include <torch/torch.h>

namespace dstrain::model {

// Queries per tile when the caller names none: min(window, kDefaultQueryTile).
constexpr int64_t kDefaultQueryTile = 512;

// q, k, v: [B, H, T, D] (key/value heads already repeated to H), one dtype and device. Returns
// [B, H, T, D], equal to SDPA with the dense band mask up to float rounding; T <= window is plain
// causal SDPA. query_tile <= 0 picks the default. window must be > 0.
torch::Tensor sliding_window_attention(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, int64_t window,
                                       int64_t query_tile = 0);

}  // namespace dstrain::model
