#pragma once
// Selective activation checkpointing (model.gradient_checkpointing: selective): a checkpointed
// decoder layer keeps, beside its input, its attention's output and softmax statistics from the
// forward, and its recompute in backward re-runs the norms, projections, RoPE and the MLP but not
// attention.
//
// Why: at long sequences attention is most of a layer's FLOPs (quadratic in T, the rest linear), so
// plain checkpointing spends most of its extra forward on attention. Keeping attention's result
// costs per token per layer H·D elements in the model's dtype (the output) and H float32 (the
// log-sum-exp), a fraction of what the layer saves without checkpointing (estimate/activations.h).
//
// How: checkpoint_layers (blocks.h) runs each checkpointed layer inside a KeepAttentionScope over
// an AttentionKeep of its own. causal_attention (layers.h) asks attention_keep() whether a scope is
// active on this thread and then calls keep_attention() instead of SDPA:
//   - in the checkpoint's forward (grad mode off) it runs an SDPA kernel that also returns the
//     log-sum-exp (CPU: flash for CPU; CUDA: flash for float16/bfloat16 with a head_dim that is a
//     multiple of 8 up to 256, else memory-efficient) and appends output and statistics to the
//     keep;
//   - in the recompute (grad mode on) it takes the oldest entry and returns its output through an
//     autograd Function whose inputs are q, k, v, so the layer's graph reaches the projections;
//     that Function's backward is the kernel's own backward from the kept output and statistics.
// An entry leaves the keep when the recompute takes it and is freed with the recompute's graph:
// one backward per forward, like the offload store (a second backward through the same graph is an
// internal error).
//
// Same results: on the CPU the forward and backward kernels are the ones SDPA's autograd runs
// without checkpointing (flash for CPU, grouped-query attention native), so losses and gradients
// match bit for bit. On CUDA grouped-query key/value heads are repeated to the query heads before
// the kernel (their gradients summed back by autograd), which SDPA may not do: equal within
// rounding.
//
// Not kept (the attention is recomputed as with `true`, after one warning per process): sliding-
// window layers whose sequence is longer than their window (the tiled band kernel,
// sliding_window_attention.h, keeps no statistics), rows of packed documents (their attention
// runs per document, document_attention.h) and devices other than the CPU and CUDA.
//
// Threads: a scope is per thread (the forward's and the autograd engine's run the two calls); an
// AttentionKeep is used by one layer call at a time, its forward and recompute never overlap.

#include <cstdint>
#include <deque>
#include <optional>

#include <torch/types.h>

namespace dstrain::model {

// What one attention call of a checkpointed forward leaves for its recompute.
struct KeptAttention {
  enum class Kernel { kCpuFlash, kCudaFlash, kCudaEfficient };
  Kernel kernel = Kernel::kCpuFlash;
  torch::Tensor out;  // [B, H, T, D] in q's dtype
  torch::Tensor lse;  // [B, H, T] float32 (CUDA memory-efficient: T rounded up to 32)
  // The CUDA kernels' bookkeeping for their backward (empty tensors and zeros without dropout).
  torch::Tensor cum_seq_q, cum_seq_k, philox_seed, philox_offset;
  int64_t max_q = 0, max_k = 0;
};

// The attention results of one checkpointed layer call, oldest first.
class AttentionKeep {
 public:
  void push(KeptAttention kept) { entries_.push_back(std::move(kept)); }
  // The oldest entry, removed; Error(kInternal) when there is none (the recompute ran twice).
  KeptAttention take();
  size_t size() const { return entries_.size(); }

 private:
  std::deque<KeptAttention> entries_;
};

// While alive, causal_attention on this thread keeps into / takes from `keep`.
class KeepAttentionScope {
 public:
  explicit KeepAttentionScope(AttentionKeep& keep);
  ~KeepAttentionScope();
  KeepAttentionScope(const KeepAttentionScope&) = delete;
  KeepAttentionScope& operator=(const KeepAttentionScope&) = delete;

 private:
  AttentionKeep* previous_;
};

// The active keep of this thread, if attention over q (with `window`, over rows of packed
// documents when `packed`) can be kept; null otherwise (no scope, or a case that is recomputed:
// see above, warned once per process).
AttentionKeep* attention_keep(const torch::Tensor& q, std::optional<int64_t> window,
                              bool packed = false);

// Causal attention q [B, H, T, D], k and v [B, KV, T, D] → [B, H, T, D] through `keep`: with grad
// mode off computed and kept, with it on taken from the keep (see above).
torch::Tensor keep_attention(AttentionKeep& keep, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v);

}  // namespace dstrain::model
