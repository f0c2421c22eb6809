// The fused AdamW kernel. Every operation is an explicit round-to-nearest intrinsic (__fmul_rn,
// __fadd_rn, __fdiv_rn, __fsqrt_rn): nvcc may not contract them into FMAs, which keeps the result
// identical to the CPU kernel (compiled with -ffp-contract=off, same operation order).

#include <cuda_bf16.h>

#include "kernels/adamw_cuda_launch.h"

namespace dstrain::kernels::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

__device__ inline float grad_at(const void* grad, GradType type, int64_t i) {
  if (type == GradType::kBFloat16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(grad)[i]);
  }
  return static_cast<const float*>(grad)[i];
}

__global__ void adamw_kernel(AdamWBuffers b, AdamWStep s) {
  const float neg_step = -s.step_size;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < b.n; i += stride) {
    const float grad = grad_at(b.grad, b.grad_type, i);
    const float param = __fmul_rn(b.param[i], s.decay_factor);
    const float exp_avg =
        __fadd_rn(__fmul_rn(b.exp_avg[i], s.beta1), __fmul_rn(s.one_minus_beta1, grad));
    const float exp_avg_sq = __fadd_rn(__fmul_rn(b.exp_avg_sq[i], s.beta2),
                                       __fmul_rn(__fmul_rn(s.one_minus_beta2, grad), grad));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(exp_avg_sq), s.bias2_sqrt), s.eps);
    const float updated = __fadd_rn(param, __fdiv_rn(__fmul_rn(neg_step, exp_avg), denom));
    b.exp_avg[i] = exp_avg;
    b.exp_avg_sq[i] = exp_avg_sq;
    b.param[i] = updated;
    if (b.param_bf16 != nullptr) {
      b.param_bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(updated));
    }
  }
}

}  // namespace

cudaError_t launch_adamw(const AdamWBuffers& buffers, const AdamWStep& step, cudaStream_t stream) {
  int64_t blocks = (buffers.n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  adamw_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(buffers, step);
  return cudaGetLastError();
}

}  // namespace dstrain::kernels::detail
