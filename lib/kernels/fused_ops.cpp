#include "kernels/fused_ops.h"

#include "core/error.h"
#include "kernels/fused_ops_launch.h"

namespace dstrain::kernels {
namespace {

void check_launch(cudaError_t status, const char* kernel, int64_t n) {
  if (status != cudaSuccess) {
    fail(ErrorKind::kRuntime, "{}: launching the kernel over {} elements failed: {}", kernel, n,
         cudaGetErrorString(status));
  }
}

void require(bool ok, const char* kernel, const char* what) {
  if (!ok) fail(ErrorKind::kInternal, "{}: {}", kernel, what);
}

}  // namespace

void rope_cuda(const RopeArgs& a, CudaStream stream) {
  require(a.batch >= 0 && a.seq_len >= 0 && a.heads >= 0 && a.dim >= 0 && a.dim % 2 == 0,
          "rope_cuda", "batch, seq_len, heads and dim must be non-negative and dim even");
  const int64_t n = a.batch * a.seq_len * a.heads * a.dim;
  if (n == 0) return;
  require(a.x && a.out && a.cos && a.sin, "rope_cuda",
          "x, out, cos and sin must be device pointers");
  check_launch(detail::launch_rope(a, stream), "rope_cuda", n);
}

void swiglu_cuda(const SwigluArgs& a, CudaStream stream) {
  require(a.n >= 0, "swiglu_cuda", "negative element count");
  if (a.n == 0) return;
  require(a.gate && a.up && a.out, "swiglu_cuda", "gate, up and out must be device pointers");
  check_launch(detail::launch_swiglu(a, stream), "swiglu_cuda", a.n);
}

void swiglu_backward_cuda(const SwigluBackwardArgs& a, CudaStream stream) {
  require(a.n >= 0, "swiglu_backward_cuda", "negative element count");
  if (a.n == 0) return;
  require(a.grad && a.gate && a.up && a.grad_gate && a.grad_up, "swiglu_backward_cuda",
          "grad, gate, up, grad_gate and grad_up must be device pointers");
  check_launch(detail::launch_swiglu_backward(a, stream), "swiglu_backward_cuda", a.n);
}

void cross_entropy_cuda(const CrossEntropyArgs& a, CudaStream stream) {
  require(a.rows >= 0 && a.vocab > 0, "cross_entropy_cuda",
          "rows must be non-negative and vocab positive");
  if (a.rows == 0) return;
  require(a.rows < (int64_t{1} << 31), "cross_entropy_cuda", "more than 2^31 - 1 rows");
  require(a.logits && a.labels && a.loss, "cross_entropy_cuda",
          "logits, labels and loss must be device pointers");
  check_launch(detail::launch_cross_entropy(a, stream), "cross_entropy_cuda", a.rows * a.vocab);
}

void add_rms_norm_cuda(const AddRmsNormArgs& a, CudaStream stream) {
  require(a.rows >= 0 && a.hidden > 0 && a.hidden <= kAddRmsNormMaxHidden, "add_rms_norm_cuda",
          "rows must be non-negative and hidden in [1, kAddRmsNormMaxHidden]");
  if (a.rows == 0) return;
  require(a.rows < (int64_t{1} << 31), "add_rms_norm_cuda", "more than 2^31 - 1 rows");
  require(a.x && a.delta && a.weight && a.sum && a.out && a.rstd, "add_rms_norm_cuda",
          "x, delta, weight, sum, out and rstd must be device pointers");
  check_launch(detail::launch_add_rms_norm(a, stream), "add_rms_norm_cuda", a.rows * a.hidden);
}

void add_rms_norm_backward_cuda(const AddRmsNormBackwardArgs& a, CudaStream stream) {
  require(a.rows >= 0 && a.hidden > 0 && a.hidden <= kAddRmsNormMaxHidden,
          "add_rms_norm_backward_cuda",
          "rows must be non-negative and hidden in [1, kAddRmsNormMaxHidden]");
  if (a.rows == 0) return;
  require(a.grad_out && a.sum && a.weight && a.rstd && a.grad_in, "add_rms_norm_backward_cuda",
          "grad_out, sum, weight, rstd and grad_in must be device pointers");
  require(!a.grad_weight || a.workspace, "add_rms_norm_backward_cuda",
          "the weight's gradient needs a workspace");
  check_launch(detail::launch_add_rms_norm_backward(a, stream), "add_rms_norm_backward_cuda",
               a.rows * a.hidden);
}

}  // namespace dstrain::kernels
