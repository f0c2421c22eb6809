#pragma once
// The one place where LibTorch version differences live. dstrain builds against Debian's
// LibTorch 1.13 (CPU) and against the LibTorch 2.x inside a CUDA PyTorch wheel; each difference
// gets one small inline function here with an #if on TORCH_VERSION_MAJOR, so no other file needs to
// know which it is. Include this only from modules that link LibTorch.

#include <torch/torch.h>
#include <torch/version.h>

namespace dstrain::compat {

// Scaled-dot-product attention, softmax(q·kᵀ/sqrt(D) + causal mask)·v, no dropout.
// q: [B, H, Tq, D], k and v: [B, H, Tk, D] (same head count: callers expand grouped KV heads
// first). Returns [B, H, Tq, D] in q's dtype. `is_causal` masks key j > query i (top-left aligned,
// Tq == Tk).
inline torch::Tensor scaled_dot_product_attention(const torch::Tensor& q, const torch::Tensor& k,
                                                  const torch::Tensor& v, bool is_causal) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0, is_causal);
#else
  // 1.13 exposes it as a private op that also returns the attention weights (ignored here).
  return std::get<0>(at::_scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                       /*need_attn_weights=*/false, is_causal));
#endif
}

}  // namespace dstrain::compat
