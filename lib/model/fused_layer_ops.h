#pragma once
// The decoder layer's elementwise steps — RMSNorm (alone, or with the residual add before it),
// rotary embeddings, the SwiGLU product, the residual add after the MLP — each a single kernel (or
// part of one) on a GPU and PyTorch's eager ops elsewhere. The eager ops are transformers' own
// formulas op for op (the CPU path matches it bit for bit in bfloat16); on a GPU they cost one
// pass over memory per op, which for the small hidden sizes of 0.5B-8B models is most of their
// time, so there: RMSNorm alone is PyTorch's fused kernel (at::_fused_rms_norm and its backward);
// the add + RMSNorm, RoPE and SwiGLU are dstrain's (kernels/fused_ops.h), each a forward and a
// backward kernel computing in float32 and rounding once; the add after the MLP is the down
// projection's matmul epilogue (transformers rounds after every op, so in bfloat16 the two differ
// in the last bits; the reference suite's bf16 rule holds both to the float32 answer).
//
// DSTRAIN_CUDA_KERNELS=0 in the environment turns the fused path off (read once per process), so
// that a benchmark measures both on the same card (docs/gpu.md). Each fused path also has a switch
// of its own (FusedPath): the trainer checks every path on the run's card before the first step
// (kernel_check.h) and switches off any that fails, its eager ops then running in its place.

#include <utility>

#include <torch/torch.h>

#include "kernels/fused_ops.h"

namespace dstrain::model {

// True when `x`'s step goes through a fused kernel: x on a CUDA device, float32 or bfloat16, a
// build with the CUDA kernels, and DSTRAIN_CUDA_KERNELS not "0".
bool use_fused_kernels(const torch::Tensor& x);

// The fused paths of a decoder layer, each switched on or off on its own (process-wide; all on at
// start): where one is off, its eager ops run even where use_fused_kernels holds.
// kVarlenAttention: packed documents' attention through FlashAttention's variable-length kernels
// (document_attention.h); kGroupedExperts: a MoE layer's experts as one grouped matrix product
// per projection (moe.h).
enum class FusedPath {
  kAddRmsNorm,
  kAddProjection,
  kQkv,
  kRotary,
  kSwiglu,
  kVarlenAttention,
  kGroupedExperts
};
inline constexpr int kFusedPathCount = 7;
const char* fused_path_name(FusedPath path);  // "add + RMSNorm", "add after projection", ...
bool fused_path_on(FusedPath path);
void set_fused_path_on(FusedPath path, bool on);

// weight · x / sqrt(mean(x²) + eps) over the last dimension, statistics in float32; x's dtype.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// The residual add and the RMSNorm after it: {x + delta, rms_norm(x + delta, weight, eps)}. On a
// GPU one kernel forward (the sum rounded as the eager add rounds it, then normalised as
// rms_norm's kernel does) and one backward that adds the residual's gradient to the norm's and
// skips the weight's gradient when the weight is frozen; elsewhere the eager add and rms_norm.
std::pair<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x,
                                                     const torch::Tensor& delta,
                                                     const torch::Tensor& weight, double eps);

// add_rms_norm through the kernels whatever the device: the CUDA kernels for CUDA tensors, their
// CPU references (float32 only) otherwise, so that the CPU tests reach its autograd function.
std::pair<torch::Tensor, torch::Tensor> add_rms_norm_kernels(const torch::Tensor& x,
                                                             const torch::Tensor& delta,
                                                             const torch::Tensor& weight,
                                                             double eps);

// residual + x·weightᵀ (x [..., in], weight [out, in], residual [..., out]): the residual add after
// a projection. Where use_fused_kernels(x) holds (and the dtypes agree) the add is the matmul's
// epilogue (add_projection_epilogue); elsewhere the eager projection, then the add.
torch::Tensor add_projection(const torch::Tensor& residual, const torch::Tensor& x,
                             const torch::Tensor& weight);

// add_projection's fused form on any device: addmm with beta 1, the sum rounded once. With a
// [rows, out] residual ATen copies the residual into the output and the GEMM adds its product to
// it (beta 1): a copy and one GEMM, where the eager form is the GEMM and an add reading both.
torch::Tensor add_projection_epilogue(const torch::Tensor& residual, const torch::Tensor& x,
                                      const torch::Tensor& weight);

// Rotary embedding of x [B, T, H, D] with the tables cos/sin [T, D] (x's dtype, from
// rope_tables), or [B, T, D] per token (packed documents: each token at its position in its
// document): x·cos + rotate_half(x)·sin. Returns [B, T, H, D]. Per-token tables go through the
// kernel as one sequence of B·T tokens where x's rows follow each other in memory as its tokens do
// (the projections' outputs), else through the eager ops.
torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

// silu(gate) · up, elementwise, same shapes.
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);

// rotary and swiglu through the kernels whatever the device: the CUDA kernels for CUDA tensors,
// their CPU references (float32 only) otherwise.
torch::Tensor rotary_kernels(const torch::Tensor& x, const torch::Tensor& cos,
                             const torch::Tensor& sin);
// The same with per-token tables cos/sin [B, T, D]; x's rows must follow each other in memory as
// its tokens do (stride(0) == T · stride(1)).
torch::Tensor rotary_kernels_per_token(const torch::Tensor& x, const torch::Tensor& cos,
                                       const torch::Tensor& sin);
torch::Tensor swiglu_kernels(const torch::Tensor& gate, const torch::Tensor& up);

// The kernels' RoPE arguments for x [B, T, H, D] (last dimension contiguous) into out (contiguous,
// same shape) with the tables cos/sin [T, D] (contiguous, x's dtype), for kernels::rope_cuda or
// kernels::rope_reference.
kernels::RopeArgs rope_args(const torch::Tensor& x, const torch::Tensor& out,
                            const torch::Tensor& cos, const torch::Tensor& sin, bool inverse);

// Cross-entropy of each row of logits [n, V] against int64 labels [n] (kernels::CrossEntropyArgs:
// 0 for ignore_index, NaN for a label outside [0, V)), float32 [n]; with `grad` the logits are
// overwritten by the gradient of the rows' sum. Only where use_fused_kernels(logits).
torch::Tensor fused_cross_entropy(torch::Tensor& logits, const torch::Tensor& labels,
                                  int64_t ignore_index, bool grad);

}  // namespace dstrain::model
