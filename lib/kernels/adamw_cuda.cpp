#include "kernels/adamw_cuda.h"

#include "core/error.h"
#include "kernels/adamw_cuda_launch.h"

namespace dstrain::kernels {

void adamw_update_cuda(const AdamWBuffers& b, const AdamWStep& step, CudaStream stream) {
  if (b.n < 0) fail(ErrorKind::kInternal, "adamw_update_cuda: negative element count {}", b.n);
  if (b.n == 0) return;
  if (b.param == nullptr || b.exp_avg == nullptr || b.exp_avg_sq == nullptr || b.grad == nullptr) {
    fail(ErrorKind::kInternal,
         "adamw_update_cuda: param, exp_avg, exp_avg_sq and grad must all be device pointers "
         "(got {} {} {} {})",
         static_cast<const void*>(b.param), static_cast<const void*>(b.exp_avg),
         static_cast<const void*>(b.exp_avg_sq), b.grad);
  }
  cudaError_t status = detail::launch_adamw(b, step, stream);
  if (status != cudaSuccess) {
    fail(ErrorKind::kRuntime, "adamw_update_cuda: launching the kernel over {} elements failed: {}",
         b.n, cudaGetErrorString(status));
  }
}

bool cuda_kernels_available() {
  return true;
}

}  // namespace dstrain::kernels
