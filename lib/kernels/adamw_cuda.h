#pragma once
// Fused AdamW on the GPU over flat device arrays: the CUDA twin of optim/adamw_kernel.h, with the
// same math in the same order and IEEE round-to-nearest operations without FMA contraction, so an
// element's result matches the CPU kernel's bit for bit. Host-side header: no CUDA types leak out
// (a stream is passed as CudaStream, which is cudaStream_t).

#include <cstdint>

struct CUstream_st;

namespace dstrain::kernels {

using CudaStream = CUstream_st*;  // cudaStream_t

// Per-step constants (lib/optim's AdamWScalars is this type).
struct AdamWStep {
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float eps = 0;
  float decay_factor = 1;  // 1 - lr·weight_decay, or 1 where no decay applies
  float step_size = 0;     // lr / (1 - beta1^t)
  float bias2_sqrt = 1;    // sqrt(1 - beta2^t)
};

enum class GradType { kFloat32, kBFloat16 };

// Device pointers, n elements each. grad holds float or bfloat16 (raw bits) per grad_type.
// param_bf16, when not null, receives the updated parameter rounded to bfloat16 (nearest even),
// e.g. the compute copy of an fp32 master shard.
struct AdamWBuffers {
  float* param = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  GradType grad_type = GradType::kFloat32;
  uint16_t* param_bf16 = nullptr;
  int64_t n = 0;
};

// For i in [0, n): p *= decay; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
// p -= step_size · m / (sqrt(v)/bias2_sqrt + eps); param_bf16[i] = bf16(p).
// Enqueued on `stream`; returns without waiting. Throws Error(kInternal) for a negative n or a
// missing pointer, Error(kRuntime) when the launch fails, Error(kNotImplemented) in a build
// without CUDA.
void adamw_update_cuda(const AdamWBuffers& buffers, const AdamWStep& step, CudaStream stream);

// True when this build compiled the CUDA kernels (it says nothing about a device being present).
bool cuda_kernels_available();

}  // namespace dstrain::kernels
