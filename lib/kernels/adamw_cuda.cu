// The fused AdamW kernel. Every operation is an explicit round-to-nearest intrinsic (__fmul_rn,
// __fadd_rn, __fdiv_rn, __fsqrt_rn): nvcc may not contract them into FMAs, which keeps the result
// identical to the CPU kernel (compiled with -ffp-contract=off, same operation order). The kernel
// is bound by memory bandwidth (28 bytes an element with bf16 gradients and copy), so where every
// array is aligned for it a thread moves four elements a load (16 bytes of float32); the math per
// element is the same either way.

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/adamw_cuda_launch.h"

namespace dstrain::kernels::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;
constexpr int kWide = 4;

struct alignas(16) Float4 {
  float v[kWide];
};
struct alignas(8) Bf16x4 {
  __nv_bfloat16 v[kWide];
};

struct Updated {
  float param, exp_avg, exp_avg_sq;
};

__device__ inline Updated adamw_element(float param, float exp_avg, float exp_avg_sq, float grad,
                                        const AdamWStep& s) {
  const float decayed = __fmul_rn(param, s.decay_factor);
  const float m = __fadd_rn(__fmul_rn(exp_avg, s.beta1), __fmul_rn(s.one_minus_beta1, grad));
  const float v = __fadd_rn(__fmul_rn(exp_avg_sq, s.beta2),
                            __fmul_rn(__fmul_rn(s.one_minus_beta2, grad), grad));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias2_sqrt), s.eps);
  return {__fadd_rn(decayed, __fdiv_rn(__fmul_rn(-s.step_size, m), denom)), m, v};
}

__device__ inline float grad_at(const void* grad, GradType type, int64_t i) {
  if (type == GradType::kBFloat16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(grad)[i]);
  }
  return static_cast<const float*>(grad)[i];
}

__global__ void adamw_kernel(AdamWBuffers b, AdamWStep s) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < b.n; i += stride) {
    const Updated u = adamw_element(b.param[i], b.exp_avg[i], b.exp_avg_sq[i],
                                    grad_at(b.grad, b.grad_type, i), s);
    b.exp_avg[i] = u.exp_avg;
    b.exp_avg_sq[i] = u.exp_avg_sq;
    b.param[i] = u.param;
    if (b.param_bf16 != nullptr) {
      b.param_bf16[i] = __bfloat16_as_ushort(__float2bfloat16_rn(u.param));
    }
  }
}

// Four elements a thread over the first n / 4 * 4 elements (the caller runs the rest scalar).
__global__ void adamw_kernel_wide(AdamWBuffers b, AdamWStep s) {
  auto* param = reinterpret_cast<Float4*>(b.param);
  auto* exp_avg = reinterpret_cast<Float4*>(b.exp_avg);
  auto* exp_avg_sq = reinterpret_cast<Float4*>(b.exp_avg_sq);
  const int64_t count = b.n / kWide;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    Float4 g;
    if (b.grad_type == GradType::kBFloat16) {
      const Bf16x4 g16 = reinterpret_cast<const Bf16x4*>(b.grad)[i];
#pragma unroll
      for (int j = 0; j < kWide; ++j) g.v[j] = __bfloat162float(g16.v[j]);
    } else {
      g = reinterpret_cast<const Float4*>(b.grad)[i];
    }
    Float4 p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
    Bf16x4 copy;
#pragma unroll
    for (int j = 0; j < kWide; ++j) {
      const Updated u = adamw_element(p.v[j], m.v[j], v.v[j], g.v[j], s);
      p.v[j] = u.param;
      m.v[j] = u.exp_avg;
      v.v[j] = u.exp_avg_sq;
      copy.v[j] = __float2bfloat16_rn(u.param);
    }
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (b.param_bf16 != nullptr) reinterpret_cast<Bf16x4*>(b.param_bf16)[i] = copy;
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

bool aligned(const void* p, uintptr_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace

cudaError_t launch_adamw(const AdamWBuffers& buffers, const AdamWStep& step, cudaStream_t stream) {
  const uintptr_t grad_bytes = buffers.grad_type == GradType::kBFloat16 ? 8 : 16;
  const bool wide = buffers.n >= kWide && aligned(buffers.param, 16) &&
                    aligned(buffers.exp_avg, 16) && aligned(buffers.exp_avg_sq, 16) &&
                    aligned(buffers.grad, grad_bytes) && aligned(buffers.param_bf16, 8);
  if (!wide) {
    adamw_kernel<<<blocks_for(buffers.n), kThreads, 0, stream>>>(buffers, step);
    return cudaGetLastError();
  }
  const int64_t body = buffers.n / kWide * kWide;
  adamw_kernel_wide<<<blocks_for(body / kWide), kThreads, 0, stream>>>(buffers, step);
  if (body < buffers.n) {
    AdamWBuffers tail = buffers;
    tail.param += body;
    tail.exp_avg += body;
    tail.exp_avg_sq += body;
    tail.grad = buffers.grad_type == GradType::kBFloat16
                    ? static_cast<const void*>(static_cast<const uint16_t*>(buffers.grad) + body)
                    : static_cast<const void*>(static_cast<const float*>(buffers.grad) + body);
    if (tail.param_bf16 != nullptr) tail.param_bf16 += body;
    tail.n = buffers.n - body;
    adamw_kernel<<<1, kThreads, 0, stream>>>(tail, step);
  }
  return cudaGetLastError();
}

}  // namespace dstrain::kernels::detail
