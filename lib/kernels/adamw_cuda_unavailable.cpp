// Built instead of the CUDA kernels when configure found no CUDA toolkit: asking for them is then
// a clear error rather than a link failure.

#include "core/error.h"
#include "kernels/adamw_cuda.h"

namespace dstrain::kernels {

void adamw_update_cuda(const AdamWBuffers& buffers, const AdamWStep& step, CudaStream stream) {
  fail(ErrorKind::kNotImplemented,
       "this dstrain was built without CUDA (no toolkit found at configure time): the CUDA AdamW "
       "kernel is not available; see docs/gpu.md");
}

bool cuda_kernels_available() {
  return false;
}

}  // namespace dstrain::kernels
