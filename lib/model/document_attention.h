#pragma once
// Documents packed into the rows of a batch (data.packing: documents), and attention within them:
// each token attends causally to the tokens of its own document only (with a window, to the
// `window` latest of them, itself included), and its RoPE position is its index in its document,
// as transformers computes a packed batch whose position ids restart at each document
// (masking_utils' packed sequences) and as FlashAttention's variable-length kernels do.
//
// Each (row, document) piece is its own causal attention over q, k, v narrowed to it: no mask and
// no [T, T] scores; a piece longer than the window goes through sliding_window_attention. The
// pieces partition every row, so backward differentiates each piece over detached views of q, k,
// v and copies its dq, dk, dv into its rows, as sliding_window_attention does with its tiles
// (differentiating through narrow() views instead would write a zero-padded [B, H, T, D] gradient
// per piece).
//
// On a GPU in bfloat16 or float16 (head size a multiple of 8, at most 256) the pieces go instead
// through FlashAttention's variable-length kernels as ATen exposes them
// (at::_flash_attention_forward and _backward with the pieces' cumulative lengths, the window as
// its left size): one kernel per direction for the whole batch. That path is one of the fused paths
// (FusedPath::kVarlenAttention, fused_layer_ops.h): checked on the run's card before the first step
// against the pieces one by one (kernel_check.h) and switched off where it fails;
// DSTRAIN_CUDA_KERNELS=0 turns it off.

#include <cstdint>
#include <optional>
#include <vector>

#include <torch/types.h>

namespace dstrain::model {

struct Documents {
  // Row b holds documents of lengths[b][0], lengths[b][1], ... back to back from position 0; they
  // sum to the row's length. Padding at the end of a row is one more document.
  std::vector<std::vector<int64_t>> lengths;

  // Error(kInternal) unless there are `rows` rows, each of positive lengths summing to `seq_len`.
  void check(int64_t rows, int64_t seq_len) const;
  // The longest document of any row.
  int64_t longest() const;
  // Each token's position in its document, [rows, seq_len] int64 on the CPU.
  torch::Tensor positions(int64_t seq_len) const;
  // The documents where `position_ids` [B, T] (int64) restart at 0, as transformers reads a packed
  // batch; nullopt when it does not start at 0 or a document's positions do not count up by 1.
  static std::optional<Documents> from_position_ids(const torch::Tensor& position_ids);
};

// q [B, H, T, D], k and v [B, KV, T, D] (H a multiple of KV, each key/value head serving H/KV
// consecutive query heads) → [B, H, T, D]: causal attention within each document of `documents`
// (checked against B and T), over a sliding `window` when given.
torch::Tensor document_attention(const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, const Documents& documents,
                                 std::optional<int64_t> window);

// Whether document_attention takes the variable-length kernels for q (see above).
bool use_varlen_attention(const torch::Tensor& q);

// The two paths on their own, whatever the device and switches (for the first-use check):
// FlashAttention's variable-length kernels (CUDA, bfloat16 or float16 only), and the pieces one by
// one.
torch::Tensor varlen_document_attention(const torch::Tensor& q, const torch::Tensor& k,
                                        const torch::Tensor& v, const Documents& documents,
                                        std::optional<int64_t> window);
torch::Tensor piecewise_document_attention(const torch::Tensor& q, const torch::Tensor& k,
                                           const torch::Tensor& v, const Documents& documents,
                                           std::optional<int64_t> window);

}  // namespace dstrain::model
