// The fused kernels (kernels/fused_ops.h). They are bound by memory bandwidth, so each moves 16
// bytes a load where the sizes and addresses allow (8 bf16 / 4 float), and falls back to narrower
// loads otherwise. Elementwise ones stride over the array (RoPE: over packs of pairs); the
// cross-entropy runs one block per row: a pass for the row's max and sum of exponentials (online
// softmax, merged across the block), the loss, then a pass that writes the gradient over the
// logits: two reads and one write of the logits in all. The add + RMSNorm runs one block per row
// forward (the sum written, its squares summed, the row normalised from the sum just written);
// backward up to 1024 blocks stride over the rows (8 or more each), keeping their shares of the
// weight's gradient in shared memory, and a second kernel sums the blocks' shares.

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

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

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// True when p is aligned for loads of `bytes` bytes.
bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// N consecutive pairs per thread (N divides dim / 2, every row start aligned for N elements);
// Index is 32-bit when every offset fits, which saves the 64-bit divisions of the index math.
template <typename T, int N, typename Index>
__global__ void rope_kernel(RopeArgs a) {
  using P = Pack<T, N>;
  const T* x = static_cast<const T*>(a.x);
  const T* cos = static_cast<const T*>(a.cos);
  const T* sin = static_cast<const T*>(a.sin);
  T* out = static_cast<T*>(a.out);
  const Index half = static_cast<Index>(a.dim / 2), packs_per_half = half / N;
  const Index heads = static_cast<Index>(a.heads), seq_len = static_cast<Index>(a.seq_len);
  const Index dim = static_cast<Index>(a.dim);
  const Index count = static_cast<Index>(a.batch * a.seq_len * a.heads) * packs_per_half;
  const Index stride = gridDim.x * blockDim.x;
  for (Index p = blockIdx.x * blockDim.x + threadIdx.x; p < count; p += stride) {
    const Index d = p % packs_per_half * N;
    const Index head_row = p / packs_per_half;  // (b · seq_len + t) · heads + h
    const Index h = head_row % heads, bt = head_row / heads, t = bt % seq_len;
    const Index in = bt / seq_len * static_cast<Index>(a.batch_stride) +
                     t * static_cast<Index>(a.seq_stride) + h * static_cast<Index>(a.head_stride) +
                     d;
    const Index o = head_row * dim + d, c = t * dim + d;
    const P x1 = *reinterpret_cast<const P*>(x + in),
            x2 = *reinterpret_cast<const P*>(x + in + half);
    const P c1 = *reinterpret_cast<const P*>(cos + c),
            c2 = *reinterpret_cast<const P*>(cos + c + half);
    const P s1 = *reinterpret_cast<const P*>(sin + c),
            s2 = *reinterpret_cast<const P*>(sin + c + half);
    P o1, o2;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      float r1, r2;
      math::rope_pair(to_float(x1.v[j]), to_float(x2.v[j]), to_float(c1.v[j]), to_float(c2.v[j]),
                      to_float(s1.v[j]), to_float(s2.v[j]), a.inverse, r1, r2);
      o1.v[j] = from_float<T>(r1);
      o2.v[j] = from_float<T>(r2);
    }
    *reinterpret_cast<P*>(out + o) = o1;
    *reinterpret_cast<P*>(out + o + half) = o2;
  }
}

template <typename T, int N>
void launch_rope_as(const RopeArgs& a, cudaStream_t stream) {
  const int64_t count = a.batch * a.seq_len * a.heads * (a.dim / 2) / N;
  const int64_t x_end = (a.batch - 1) * a.batch_stride + (a.seq_len - 1) * a.seq_stride +
                        (a.heads - 1) * a.head_stride + a.dim;
  const bool small =
      a.batch * a.seq_len * a.heads * a.dim < (int64_t{1} << 31) && x_end < (int64_t{1} << 31);
  if (small) {
    rope_kernel<T, N, uint32_t><<<blocks_for(count), kThreads, 0, stream>>>(a);
  } else {
    rope_kernel<T, N, int64_t><<<blocks_for(count), kThreads, 0, stream>>>(a);
  }
}

// The widest pack (16 bytes at most) that every row start, half and table row allow.
template <typename T>
void launch_rope_typed(const RopeArgs& a, cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  const auto fits = [&](int n) {
    const size_t bytes = sizeof(T) * n;
    return (a.dim / 2) % n == 0 && a.batch_stride % n == 0 && a.seq_stride % n == 0 &&
           a.head_stride % n == 0 && aligned(a.x, bytes) && aligned(a.out, bytes) &&
           aligned(a.cos, bytes) && aligned(a.sin, bytes);
  };
  if (fits(kWide)) {
    launch_rope_as<T, kWide>(a, stream);
  } else if (fits(2)) {
    launch_rope_as<T, 2>(a, stream);
  } else {
    launch_rope_as<T, 1>(a, stream);
  }
}

// Elementwise kernels take N elements a thread (16-byte loads) when n and the pointers allow.
template <typename T, int N>
__global__ void swiglu_kernel(SwigluArgs a) {
  using P = Pack<T, N>;
  const P* gate = static_cast<const P*>(a.gate);
  const P* up = static_cast<const P*>(a.up);
  P* out = static_cast<P*>(a.out);
  const int64_t count = a.n / N;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    const P g = gate[i], u = up[i];
    P o;
#pragma unroll
    for (int j = 0; j < N; ++j)
      o.v[j] = from_float<T>(math::swiglu(to_float(g.v[j]), to_float(u.v[j])));
    out[i] = o;
  }
}

template <typename T, int N>
__global__ void swiglu_backward_kernel(SwigluBackwardArgs a) {
  using P = Pack<T, N>;
  const P* grad = static_cast<const P*>(a.grad);
  const P* gate = static_cast<const P*>(a.gate);
  const P* up = static_cast<const P*>(a.up);
  P* grad_gate = static_cast<P*>(a.grad_gate);
  P* grad_up = static_cast<P*>(a.grad_up);
  const int64_t count = a.n / N;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += stride) {
    const P dy = grad[i], g = gate[i], u = up[i];
    P dg, du;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      float a_g, a_u;
      math::swiglu_backward(to_float(dy.v[j]), to_float(g.v[j]), to_float(u.v[j]), a_g, a_u);
      dg.v[j] = from_float<T>(a_g);
      du.v[j] = from_float<T>(a_u);
    }
    grad_gate[i] = dg;
    grad_up[i] = du;
  }
}

template <typename T>
bool packs_fit(int64_t n, std::initializer_list<const void*> pointers) {
  constexpr int kWide = 16 / sizeof(T);
  if (n % kWide != 0) return false;
  for (const void* p : pointers) {
    if (!aligned(p, 16)) return false;
  }
  return true;
}

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

// The sum of v over the block (a multiple of 32 threads), returned to every thread; may be called
// again by the same block.
__device__ float block_sum(float v) {
  __shared__ float sums[32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // the previous call's readers are done with sums
  if (lane == 0) sums[warp] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += sums[w];
  return total;
}

template <typename T, int N>
__global__ void add_rms_norm_kernel(AddRmsNormArgs a) {
  using P = Pack<T, N>;
  const int64_t offset = int64_t{blockIdx.x} * a.hidden;
  const P* x = reinterpret_cast<const P*>(static_cast<const T*>(a.x) + offset);
  const P* delta = reinterpret_cast<const P*>(static_cast<const T*>(a.delta) + offset);
  const P* weight = static_cast<const P*>(a.weight);
  P* sum = reinterpret_cast<P*>(static_cast<T*>(a.sum) + offset);
  P* out = reinterpret_cast<P*>(static_cast<T*>(a.out) + offset);
  const int packs = static_cast<int>(a.hidden / N);
  float squares = 0.0f;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
    const P xv = x[p], dv = delta[p];
    P sv;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      sv.v[j] = from_float<T>(to_float(xv.v[j]) + to_float(dv.v[j]));
      const float f = to_float(sv.v[j]);
      squares += f * f;
    }
    sum[p] = sv;
  }
  const float rstd = math::rms_rstd(block_sum(squares), a.hidden, a.eps);
  if (threadIdx.x == 0) a.rstd[blockIdx.x] = rstd;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {  // this thread's own packs of sum
    const P sv = sum[p], w = weight[p];
    P o;
#pragma unroll
    for (int j = 0; j < N; ++j)
      o.v[j] = from_float<T>(to_float(w.v[j]) * (to_float(sv.v[j]) * rstd));
    out[p] = o;
  }
}

// Rows blockIdx.x, blockIdx.x + gridDim.x, ...; with grad_weight, the block's share of the
// weight's gradient is summed in shared memory (element p·N + j of the row at j·packs + p, so that
// neighbouring threads touch neighbouring banks) and written to workspace row blockIdx.x.
template <typename T, int N>
__global__ void add_rms_norm_backward_kernel(AddRmsNormBackwardArgs a) {
  using P = Pack<T, N>;
  extern __shared__ float weight_share[];
  const bool with_weight = a.grad_weight != nullptr;
  const P* weight = static_cast<const P*>(a.weight);
  const int packs = static_cast<int>(a.hidden / N);
  if (with_weight) {
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
#pragma unroll
      for (int j = 0; j < N; ++j) weight_share[j * packs + p] = 0.0f;
    }
  }
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t offset = row * a.hidden;
    const P* grad = reinterpret_cast<const P*>(static_cast<const T*>(a.grad_out) + offset);
    const P* sum = reinterpret_cast<const P*>(static_cast<const T*>(a.sum) + offset);
    const P* grad_sum = a.grad_sum
                            ? reinterpret_cast<const P*>(static_cast<const T*>(a.grad_sum) + offset)
                            : nullptr;
    P* grad_in = reinterpret_cast<P*>(static_cast<T*>(a.grad_in) + offset);
    const float rstd = a.rstd[row];
    float dot = 0.0f;
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const P g = grad[p], sv = sum[p], w = weight[p];
#pragma unroll
      for (int j = 0; j < N; ++j) dot += to_float(w.v[j]) * to_float(g.v[j]) * to_float(sv.v[j]);
    }
    const float coefficient = math::rms_norm_coefficient(block_sum(dot), a.hidden, rstd);
    for (int p = threadIdx.x; p < packs; p += blockDim.x) {
      const P g = grad[p], sv = sum[p], w = weight[p];
      P residual{}, o;
      if (grad_sum) residual = grad_sum[p];
#pragma unroll
      for (int j = 0; j < N; ++j) {
        const float gf = to_float(g.v[j]), sf = to_float(sv.v[j]);
        o.v[j] = from_float<T>(math::rms_norm_grad(grad_sum ? to_float(residual.v[j]) : 0.0f, gf,
                                                   to_float(w.v[j]), sf, rstd, coefficient));
        if (with_weight) weight_share[j * packs + p] += gf * sf * rstd;
      }
      grad_in[p] = o;
    }
  }
  if (!with_weight) return;
  for (int p = threadIdx.x; p < packs; p += blockDim.x) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
      a.workspace[int64_t{blockIdx.x} * a.hidden + p * N + j] = weight_share[j * packs + p];
    }
  }
}

// One thread per element of the weight: the sum of the blocks' shares.
template <typename T>
__global__ void add_rms_norm_weight_kernel(AddRmsNormBackwardArgs a, int blocks) {
  const int64_t j = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (j >= a.hidden) return;
  float total = 0.0f;
  for (int b = 0; b < blocks; ++b) total += a.workspace[b * a.hidden + j];
  static_cast<T*>(a.grad_weight)[j] = from_float<T>(total);
}

// Threads for a block that walks a row of `packs` packs: a multiple of 32, at most kRowThreads.
int row_threads(int64_t packs) {
  const int64_t warps = (packs + 31) / 32;
  return static_cast<int>(warps * 32 < kRowThreads ? warps * 32 : kRowThreads);
}

template <typename T>
void launch_add_rms_norm(const AddRmsNormArgs& a, cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  const auto grid = static_cast<unsigned>(a.rows);
  if (packs_fit<T>(a.hidden, {a.x, a.delta, a.weight, a.sum, a.out})) {
    add_rms_norm_kernel<T, kWide><<<grid, row_threads(a.hidden / kWide), 0, stream>>>(a);
  } else {
    add_rms_norm_kernel<T, 1><<<grid, row_threads(a.hidden), 0, stream>>>(a);
  }
}

template <typename T>
void launch_add_rms_norm_backward(const AddRmsNormBackwardArgs& a, cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  const int64_t blocks = add_rms_norm_backward_blocks(a.rows);
  const auto grid = static_cast<unsigned>(blocks);
  const size_t shared = a.grad_weight ? sizeof(float) * a.hidden : 0;
  if (packs_fit<T>(a.hidden, {a.grad_out, a.grad_sum, a.sum, a.weight, a.grad_in})) {
    add_rms_norm_backward_kernel<T, kWide>
        <<<grid, row_threads(a.hidden / kWide), shared, stream>>>(a);
  } else {
    add_rms_norm_backward_kernel<T, 1><<<grid, row_threads(a.hidden), shared, stream>>>(a);
  }
  if (a.grad_weight) {
    const auto weight_grid = static_cast<unsigned>((a.hidden + kThreads - 1) / kThreads);
    add_rms_norm_weight_kernel<T>
        <<<weight_grid, kThreads, 0, stream>>>(a, static_cast<int>(blocks));
  }
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
  if (a.vocab % kPack == 0 && aligned(a.logits, 16)) {
    cross_entropy_kernel<T, kPack><<<grid, kRowThreads, 0, stream>>>(a);
  } else {
    cross_entropy_kernel<T, 1><<<grid, kRowThreads, 0, stream>>>(a);
  }
}

// wide<<<n / 16-byte packs>>> when n and every pointer allow 16-byte loads, else narrow<<<n>>>.
template <typename T, typename Args>
void launch_elementwise(void (*wide)(Args), void (*narrow)(Args), const Args& a,
                        std::initializer_list<const void*> pointers, cudaStream_t stream) {
  constexpr int kWide = 16 / sizeof(T);
  if (packs_fit<T>(a.n, pointers)) {
    wide<<<blocks_for(a.n / kWide), kThreads, 0, stream>>>(a);
  } else {
    narrow<<<blocks_for(a.n), kThreads, 0, stream>>>(a);
  }
}

// Calls fn with Element<T> for the element type's T, then returns the launch status.
template <typename T>
struct Element {
  using type = T;
};

template <typename Fn>
cudaError_t for_element_type(ElementType type, Fn&& fn) {
  if (type == ElementType::kBFloat16) {
    fn(Element<__nv_bfloat16>{});
  } else {
    fn(Element<float>{});
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_add_rms_norm(const AddRmsNormArgs& a, cudaStream_t stream) {
  return for_element_type(
      a.type, [&](auto e) { launch_add_rms_norm<typename decltype(e)::type>(a, stream); });
}

cudaError_t launch_add_rms_norm_backward(const AddRmsNormBackwardArgs& a, cudaStream_t stream) {
  return for_element_type(
      a.type, [&](auto e) { launch_add_rms_norm_backward<typename decltype(e)::type>(a, stream); });
}

cudaError_t launch_rope(const RopeArgs& a, cudaStream_t stream) {
  return for_element_type(
      a.type, [&](auto e) { launch_rope_typed<typename decltype(e)::type>(a, stream); });
}

cudaError_t launch_swiglu(const SwigluArgs& a, cudaStream_t stream) {
  return for_element_type(a.type, [&](auto e) {
    using T = typename decltype(e)::type;
    launch_elementwise<T>(swiglu_kernel<T, 16 / sizeof(T)>, swiglu_kernel<T, 1>, a,
                          {a.gate, a.up, a.out}, stream);
  });
}

cudaError_t launch_swiglu_backward(const SwigluBackwardArgs& a, cudaStream_t stream) {
  return for_element_type(a.type, [&](auto e) {
    using T = typename decltype(e)::type;
    launch_elementwise<T>(swiglu_backward_kernel<T, 16 / sizeof(T)>, swiglu_backward_kernel<T, 1>,
                          a, {a.grad, a.gate, a.up, a.grad_gate, a.grad_up}, stream);
  });
}

cudaError_t launch_cross_entropy(const CrossEntropyArgs& a, cudaStream_t stream) {
  return for_element_type(
      a.type, [&](auto e) { launch_cross_entropy<typename decltype(e)::type>(a, stream); });
}

}  // namespace dstrain::kernels::detail
