// The fused kernels (kernels/fused_ops.h). Elementwise ones stride over the array with one thread
// per element (RoPE: per pair of elements); the cross-entropy runs one block per row: a pass for
// the row's max and sum of exponentials (online softmax, merged across the block), the loss, then
// a pass that writes the gradient over the logits. Loads of the cross-entropy go 16 bytes at a time
// when the row length allows; the row then costs two reads and one write of its logits.

#include <cuda_bf16.h>

#include <cmath>

#include "kernels/fused_ops_launch.h"
#include "kernels/fused_ops_math.h"

namespace dstrain::kernels::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kRowThreads = 512;
constexpr int64_t kMaxBlocks = int64_t{1} << 16;

__device__ __forceinline__ float to_float(float x) {
  return x;
}
__device__ __forceinline__ float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

template <typename T>
__global__ void rope_kernel(RopeArgs a) {
  const T* x = static_cast<const T*>(a.x);
  const T* cos = static_cast<const T*>(a.cos);
  const T* sin = static_cast<const T*>(a.sin);
  T* out = static_cast<T*>(a.out);
  const int64_t half = a.dim / 2;
  const int64_t pairs = a.batch * a.seq_len * a.heads * half;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t p = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; p < pairs; p += stride) {
    const int64_t d = p % half;
    const int64_t h = p / half % a.heads;
    const int64_t bt = p / half / a.heads;  // b · seq_len + t
    const int64_t t = bt % a.seq_len;
    const int64_t in = bt / a.seq_len * a.batch_stride + t * a.seq_stride + h * a.head_stride + d;
    const int64_t o = (bt * a.heads + h) * a.dim + d;
    const int64_t c = t * a.dim + d;
    float out1, out2;
    math::rope_pair(to_float(x[in]), to_float(x[in + half]), to_float(cos[c]),
                    to_float(cos[c + half]), to_float(sin[c]), to_float(sin[c + half]), a.inverse,
                    out1, out2);
    out[o] = from_float<T>(out1);
    out[o + half] = from_float<T>(out2);
  }
}

template <typename T>
__global__ void swiglu_kernel(SwigluArgs a) {
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  T* out = static_cast<T*>(a.out);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    out[i] = from_float<T>(math::swiglu(to_float(gate[i]), to_float(up[i])));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(SwigluBackwardArgs a) {
  const T* grad = static_cast<const T*>(a.grad);
  const T* gate = static_cast<const T*>(a.gate);
  const T* up = static_cast<const T*>(a.up);
  T* grad_gate = static_cast<T*>(a.grad_gate);
  T* grad_up = static_cast<T*>(a.grad_up);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < a.n; i += stride) {
    float dg, du;
    math::swiglu_backward(to_float(grad[i]), to_float(gate[i]), to_float(up[i]), dg, du);
    grad_gate[i] = from_float<T>(dg);
    grad_up[i] = from_float<T>(du);
  }
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// (max, sum) of the whole block, returned to every thread.
__device__ void block_softmax_stats(float& max, float& sum) {
  __shared__ float maxes[32], sums[32];
  for (int offset = 16; offset > 0; offset /= 2) {
    math::softmax_merge(max, sum, __shfl_xor_sync(0xffffffffu, max, offset),
                        __shfl_xor_sync(0xffffffffu, sum, offset));
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    maxes[warp] = max;
    sums[warp] = sum;
  }
  __syncthreads();
  max = -INFINITY;
  sum = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w)
    math::softmax_merge(max, sum, maxes[w], sums[w]);
}

template <typename T, int N>
__global__ void cross_entropy_kernel(CrossEntropyArgs a) {
  using P = Pack<T, N>;
  T* x = static_cast<T*>(a.logits) + int64_t{blockIdx.x} * a.vocab;
  P* packs = reinterpret_cast<P*>(x);
  const int64_t count = a.vocab / N;
  float max = -INFINITY, sum = 0.0f;
  for (int64_t p = threadIdx.x; p < count; p += blockDim.x) {
    const P pack = packs[p];
#pragma unroll
    for (int j = 0; j < N; ++j) math::softmax_merge(max, sum, to_float(pack.v[j]), 1.0f);
  }
  block_softmax_stats(max, sum);
  const int64_t label = a.labels[blockIdx.x];
  const bool ignored = label == a.ignore_index;
  if (threadIdx.x == 0) {
    float loss = 0.0f;
    if (!ignored) loss = label < 0 || label >= a.vocab ? NAN : logf(sum) + max - to_float(x[label]);
    a.loss[blockIdx.x] = loss;
  }
  if (!a.write_grad) return;
  __syncthreads();  // x[label] is read before it is overwritten
  for (int64_t p = threadIdx.x; p < count; p += blockDim.x) {
    P pack = packs[p];
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const int64_t v = p * N + j;
      const float g =
          ignored ? 0.0f : expf(to_float(pack.v[j]) - max) / sum - (v == label ? 1.0f : 0.0f);
      pack.v[j] = from_float<T>(g);
    }
    packs[p] = pack;
  }
}

template <typename T>
void launch_cross_entropy(const CrossEntropyArgs& a, cudaStream_t stream) {
  constexpr int kPack = 16 / sizeof(T);
  const auto grid = static_cast<unsigned>(a.rows);
  const bool aligned = a.vocab % kPack == 0 && reinterpret_cast<uintptr_t>(a.logits) % 16 == 0;
  if (aligned) {
    cross_entropy_kernel<T, kPack><<<grid, kRowThreads, 0, stream>>>(a);
  } else {
    cross_entropy_kernel<T, 1><<<grid, kRowThreads, 0, stream>>>(a);
  }
}

}  // namespace

cudaError_t launch_rope(const RopeArgs& a, cudaStream_t stream) {
  const unsigned blocks = blocks_for(a.batch * a.seq_len * a.heads * (a.dim / 2));
  if (a.type == ElementType::kBFloat16) {
    rope_kernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(a);
  } else {
    rope_kernel<float><<<blocks, kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t launch_swiglu(const SwigluArgs& a, cudaStream_t stream) {
  if (a.type == ElementType::kBFloat16) {
    swiglu_kernel<__nv_bfloat16><<<blocks_for(a.n), kThreads, 0, stream>>>(a);
  } else {
    swiglu_kernel<float><<<blocks_for(a.n), kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t launch_swiglu_backward(const SwigluBackwardArgs& a, cudaStream_t stream) {
  if (a.type == ElementType::kBFloat16) {
    swiglu_backward_kernel<__nv_bfloat16><<<blocks_for(a.n), kThreads, 0, stream>>>(a);
  } else {
    swiglu_backward_kernel<float><<<blocks_for(a.n), kThreads, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t launch_cross_entropy(const CrossEntropyArgs& a, cudaStream_t stream) {
  if (a.type == ElementType::kBFloat16) {
    launch_cross_entropy<__nv_bfloat16>(a, stream);
  } else {
    launch_cross_entropy<float>(a, stream);
  }
  return cudaGetLastError();
}

}  // namespace dstrain::kernels::detail
