// Built instead of the CUDA kernels when configure found no CUDA toolkit: asking for them is then
// a clear error rather than a link failure.

#include "core/error.h"
#include "kernels/adamw_cuda.h"
#include "kernels/fused_ops.h"

namespace dstrain::kernels {
namespace {

[[noreturn]] void no_cuda(const char* kernel) {
  fail(ErrorKind::kNotImplemented,
       "this dstrain was built without CUDA (no toolkit found at configure time): the CUDA kernel "
       "{} is not available; see docs/gpu.md",
       kernel);
}

}  // namespace

void adamw_update_cuda(const AdamWBuffers&, const AdamWStep&, CudaStream) {
  no_cuda("adamw_update_cuda");
}
void rope_cuda(const RopeArgs&, CudaStream) {
  no_cuda("rope_cuda");
}
void swiglu_cuda(const SwigluArgs&, CudaStream) {
  no_cuda("swiglu_cuda");
}
void swiglu_backward_cuda(const SwigluBackwardArgs&, CudaStream) {
  no_cuda("swiglu_backward_cuda");
}
void cross_entropy_cuda(const CrossEntropyArgs&, CudaStream) {
  no_cuda("cross_entropy_cuda");
}
void add_rms_norm_cuda(const AddRmsNormArgs&, CudaStream) {
  no_cuda("add_rms_norm_cuda");
}
void add_rms_norm_backward_cuda(const AddRmsNormBackwardArgs&, CudaStream) {
  no_cuda("add_rms_norm_backward_cuda");
}

bool cuda_kernels_available() {
  return false;
}

}  // namespace dstrain::kernels
