#pragma once
// Tiled MLP (the ALST / DeepSpeed TiledMLP idea): a token-wise block such as the SwiGLU MLP is run
// over tiles of tokens, and in backward each tile's forward is recomputed and back-propagated on
// its own, so the block's [tokens, intermediate] activations exist for one tile at a time and are
// never saved. Only the block's input is kept for backward.
//
// Why it matters: at long sequences the MLP's intermediates (gate, up, silu(gate), their product
// and their gradients: about six [T, I] tensors, I ≈ 3·C) are the largest activations of a
// decoder layer; with activation checkpointing they are exactly what the recompute of one layer
// allocates. Tiled, the peak is about six [tile, I] tensors whatever T.
//
// Gradients: each tile's recomputed graph is differentiated with torch::autograd::grad with
// respect to the tile's input and the block's parameters, which returns the gradients without
// accumulating them into .grad; the parameter gradients are summed over the tiles (in float32 for
// reduced-precision parameters) and returned by one autograd node. Autograd then accumulates each
// parameter's gradient once per backward, so post-accumulate hooks (the ZeRO engines') fire once,
// as without tiling. (Hooks registered on a parameter tensor itself, Tensor::register_hook, do
// run for each tile's part: autograd::grad runs them for the tensors it differentiates. dstrain
// registers none.) The parameters are read from the block itself in backward, never saved: a
// ZeRO-3 engine that re-gathers them before the layer's backward is seen as it should be.
//
// Cost: one extra forward of the block per backward (on top of activation checkpointing's, if
// on), and tiles of fewer tokens make smaller, less efficient matrix products.

#include <cstdint>
#include <functional>
#include <vector>

#include <torch/types.h>

namespace dstrain::model {

// The tiling setting: tokens per tile, or one of these.
constexpr int64_t kTiledMlpOff = 0;
constexpr int64_t kTiledMlpAuto = -1;

// Tokens per tile for `setting` and a block input of `tokens` tokens of width `hidden_size`; 0
// means "run untiled". auto: ALST's rule, ceil(tokens / hidden_size) tiles of equal size (so a
// tile's [tile, I] intermediates are about the size of one MLP weight matrix, whatever the
// sequence), and untiled when that gives a single tile (tokens <= hidden_size), where tiling only
// costs. A number: tiles of that many tokens (the last one shorter), untiled when it covers every
// token.
int64_t mlp_tile_tokens(int64_t setting, int64_t tokens, int64_t hidden_size);

// A token-wise block: rows [n, in] → [n, out], row i of the output depending only on row i of the
// input, the parameters and the RNG state. Called several times per step (forward, once per tile
// in backward), always on consecutive rows of the same input in the same order.
using TokenwiseFn = std::function<torch::Tensor(const torch::Tensor&)>;

// fn(x) computed over tiles of `tile_tokens` rows of x [n, in], with the recomputation described
// above. `params` are the tensors fn reads that need gradients (parameters that require grad,
// adapters' included): a parameter fn reads but that is not listed gets no gradient. With grad
// mode off, or nothing requiring grad, the tiles are just computed one after the other. The RNG
// state is replayed for the recompute, as activation checkpointing does.
torch::Tensor tiled_tokenwise(TokenwiseFn fn, const torch::Tensor& x, int64_t tile_tokens,
                              const std::vector<torch::Tensor>& params);

}  // namespace dstrain::model
