#pragma once
// Fused kernels of the decoder layer and the loss, where PyTorch's eager ops would make several
// passes over memory (docs/gpu.md, "Fused kernels"): rotary embeddings, the SwiGLU product, and
// the cross-entropy of one chunk of logits (loss and gradient in one kernel, the gradient written
// over the logits), and the residual add fused with the RMSNorm after it. Each has a CUDA kernel (a
// build with the CUDA toolkit) and a CPU reference in float32 with the same per-element math
// (kernels/fused_ops_math.h): the reference is what the tests hold the kernels to, and what the CPU
// tests check against PyTorch's eager formulas.
//
// Host-side header: no CUDA types. Every pointer is a device pointer for the *_cuda functions and a
// host pointer for the *_reference ones; arrays are contiguous, row-major, of `type` unless said
// otherwise. The CUDA functions enqueue on `stream` and return without waiting; they throw
// Error(kInternal) for inconsistent arguments, Error(kRuntime) when the launch fails and
// Error(kNotImplemented) in a build without CUDA. The references take kFloat32 only.

#include <cstdint>

#include "kernels/adamw_cuda.h"  // CudaStream

namespace dstrain::kernels {

enum class ElementType { kFloat32, kBFloat16 };

// Rotary embedding of x [batch, seq_len, heads, dim] (strides in elements below, the last
// dimension contiguous) into out, the same shape contiguous. With x1, x2 the halves of a head's
// vector at position t and c, s the rows t of the tables cos/sin [seq_len, dim] (contiguous):
//   out1 = x1·c1 - x2·s1,  out2 = x2·c2 + x1·s2        (forward)
//   out1 = x1·c1 + x2·s2,  out2 = x2·c2 - x1·s1        (inverse: the gradient of forward)
// computed in float32 and rounded once. dim is even.
struct RopeArgs {
  const void* x = nullptr;
  void* out = nullptr;
  const void* cos = nullptr;
  const void* sin = nullptr;
  int64_t batch = 0;
  int64_t seq_len = 0;
  int64_t heads = 0;
  int64_t dim = 0;
  int64_t batch_stride = 0;  // of x
  int64_t seq_stride = 0;
  int64_t head_stride = 0;
  ElementType type = ElementType::kFloat32;
  bool inverse = false;
};

// SwiGLU: out = silu(gate)·up over n elements, float32 math, one rounding.
struct SwigluArgs {
  const void* gate = nullptr;
  const void* up = nullptr;
  void* out = nullptr;
  int64_t n = 0;
  ElementType type = ElementType::kFloat32;
};

// Its gradient: grad_gate = grad·up·σ(g)·(1 + g·(1 - σ(g))), grad_up = grad·silu(g).
struct SwigluBackwardArgs {
  const void* grad = nullptr;
  const void* gate = nullptr;
  const void* up = nullptr;
  void* grad_gate = nullptr;
  void* grad_up = nullptr;
  int64_t n = 0;
  ElementType type = ElementType::kFloat32;
};

// Cross-entropy of logits [rows, vocab] against int64 labels [rows]: loss[r] (float32) =
// logsumexp(logits[r]) - logits[r, label], 0 where label == ignore_index, NaN for a label outside
// [0, vocab) (so a bad label shows as a non-finite loss rather than a read out of bounds). With
// write_grad the logits are overwritten by the gradient of the summed loss: softmax - onehot(label)
// on counted rows, 0 on ignored ones. Max, sum and exponentials in float32.
struct CrossEntropyArgs {
  void* logits = nullptr;
  const int64_t* labels = nullptr;
  float* loss = nullptr;
  int64_t rows = 0;
  int64_t vocab = 0;
  int64_t ignore_index = -100;
  ElementType type = ElementType::kFloat32;
  bool write_grad = false;
};

// The residual add and the RMSNorm after it, over rows of `hidden` elements (x, delta, sum, out
// [rows, hidden]; weight [hidden]): per row
//   sum = x + delta (rounded to type, as the eager add rounds),
//   rstd = 1 / sqrt(mean(sum²) + eps) over the rounded sum (float32, into rstd [rows]),
//   out = weight · sum · rstd (one rounding).
// hidden ≤ kAddRmsNormMaxHidden.
struct AddRmsNormArgs {
  const void* x = nullptr;
  const void* delta = nullptr;
  const void* weight = nullptr;
  void* sum = nullptr;
  void* out = nullptr;
  float* rstd = nullptr;
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 0.0f;
  ElementType type = ElementType::kFloat32;
};

inline constexpr int64_t kAddRmsNormMaxHidden = 8192;

// Its gradient, with g the gradient of out and g_sum that of sum (the residual path; null: zero):
//   grad_in = g_sum + rstd·weight·g − sum·rstd³·mean(weight·g·sum)    (per row; the gradient of
//             both x and delta)
//   grad_weight = Σ over rows of g·sum·rstd                             (when grad_weight is set)
// The weight's gradient is summed in float32 in two passes: per block of rows into `workspace`
// (add_rms_norm_workspace(rows, hidden) floats, needed only with grad_weight), then over blocks.
struct AddRmsNormBackwardArgs {
  const void* grad_out = nullptr;
  const void* grad_sum = nullptr;
  const void* sum = nullptr;
  const void* weight = nullptr;
  const float* rstd = nullptr;
  void* grad_in = nullptr;
  void* grad_weight = nullptr;
  float* workspace = nullptr;
  int64_t rows = 0;
  int64_t hidden = 0;
  ElementType type = ElementType::kFloat32;
};

// The backward's blocks: each takes at least 8 rows (so that its share of the weight's gradient
// is worth the workspace row it writes), at most 1024 blocks (enough to fill a GPU). The
// workspace holds a share per block: add_rms_norm_workspace floats.
inline int64_t add_rms_norm_backward_blocks(int64_t rows) {
  const int64_t blocks = (rows + 7) / 8;
  return blocks < 1024 ? blocks : 1024;
}
inline int64_t add_rms_norm_workspace(int64_t rows, int64_t hidden) {
  return add_rms_norm_backward_blocks(rows) * hidden;
}

void rope_cuda(const RopeArgs& args, CudaStream stream);
void swiglu_cuda(const SwigluArgs& args, CudaStream stream);
void swiglu_backward_cuda(const SwigluBackwardArgs& args, CudaStream stream);
void cross_entropy_cuda(const CrossEntropyArgs& args, CudaStream stream);
void add_rms_norm_cuda(const AddRmsNormArgs& args, CudaStream stream);
void add_rms_norm_backward_cuda(const AddRmsNormBackwardArgs& args, CudaStream stream);

void rope_reference(const RopeArgs& args);
void swiglu_reference(const SwigluArgs& args);
void swiglu_backward_reference(const SwigluBackwardArgs& args);
void cross_entropy_reference(const CrossEntropyArgs& args);
void add_rms_norm_reference(const AddRmsNormArgs& args);
void add_rms_norm_backward_reference(const AddRmsNormBackwardArgs& args);

}  // namespace dstrain::kernels
