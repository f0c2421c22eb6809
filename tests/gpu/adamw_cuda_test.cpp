// The CUDA AdamW kernel against the CPU kernel (optim/adamw_kernel) on the same random data: both
// use the same operation order without FMA contraction, so results must agree bit for bit.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "kernels/adamw_cuda.h"
#include "optim/adamw_kernel.h"

namespace dstrain::kernels {
namespace {

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

uint16_t to_bf16_bits(float f) {  // round to nearest even; the data holds no NaN
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16_bits(uint16_t b) {
  uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

optim::AdamWScalars scalars_for(int step, float lr, float weight_decay) {
  const float beta1 = 0.9f, beta2 = 0.999f;
  optim::AdamWScalars s;
  s.beta1 = beta1;
  s.one_minus_beta1 = 1 - beta1;
  s.beta2 = beta2;
  s.one_minus_beta2 = 1 - beta2;
  s.eps = 1e-8f;
  s.decay_factor = 1 - lr * weight_decay;
  s.step_size = lr / (1 - static_cast<float>(std::pow(beta1, step)));
  s.bias2_sqrt = std::sqrt(1 - static_cast<float>(std::pow(beta2, step)));
  return s;
}

template <typename T>
T* device_copy(const std::vector<T>& host) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
            cudaSuccess);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> host_copy(const T* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

size_t count_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return bad;
}

// Three steps over n elements (not a multiple of the block size or of the 4-element loads),
// gradient in fp32 or bf16. skip: elements before the arrays' starts in their allocations (0: the
// kernel's 4-wide loads and a scalar tail; 1: misaligned, all scalar).
void run_parity(GradType grad_type, bool write_bf16, int64_t skip = 0) {
  const int64_t n = 100'003;
  std::mt19937 gen(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
  for (auto& x : p) x = normal(gen);
  const auto with_skip = [&](const std::vector<float>& x) {
    std::vector<float> padded(skip, 0.0f);
    padded.insert(padded.end(), x.begin(), x.end());
    return padded;
  };

  float* dp_alloc = device_copy(with_skip(p));
  float* dm_alloc = device_copy(with_skip(m));
  float* dv_alloc = device_copy(with_skip(v));
  float *dp = dp_alloc + skip, *dm = dm_alloc + skip, *dv = dv_alloc + skip;
  uint16_t* dbf16_alloc = nullptr;
  if (write_bf16) {
    void* raw = nullptr;
    CUDA_OK(cudaMalloc(&raw, (n + skip) * sizeof(uint16_t)));
    dbf16_alloc = static_cast<uint16_t*>(raw);
  }
  uint16_t* dbf16 = dbf16_alloc == nullptr ? nullptr : dbf16_alloc + skip;
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  for (int step = 1; step <= 3; ++step) {
    std::vector<float> g(n);
    std::vector<uint16_t> g_bf16(n);
    for (int64_t i = 0; i < n; ++i) {
      g[i] = normal(gen) * 0.1f;
      g_bf16[i] = to_bf16_bits(g[i]);
      if (grad_type == GradType::kBFloat16) g[i] = from_bf16_bits(g_bf16[i]);  // what the GPU sees
    }
    g_bf16.insert(g_bf16.begin(), skip, 0);
    void* dg_alloc = grad_type == GradType::kBFloat16
                         ? static_cast<void*>(device_copy(g_bf16))
                         : static_cast<void*>(device_copy(with_skip(g)));
    void* dg = grad_type == GradType::kBFloat16
                   ? static_cast<void*>(static_cast<uint16_t*>(dg_alloc) + skip)
                   : static_cast<void*>(static_cast<float*>(dg_alloc) + skip);
    const auto scalars = scalars_for(step, 1e-3f, 0.01f);
    optim::adamw_update(p.data(), g.data(), m.data(), v.data(), n, scalars);
    AdamWBuffers buffers{dp, dm, dv, dg, grad_type, dbf16, n};
    adamw_update_cuda(buffers, scalars, stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaFree(dg_alloc));
  }

  EXPECT_EQ(count_mismatches(p, host_copy(dp, n)), 0u) << "param";
  EXPECT_EQ(count_mismatches(m, host_copy(dm, n)), 0u) << "exp_avg";
  EXPECT_EQ(count_mismatches(v, host_copy(dv, n)), 0u) << "exp_avg_sq";
  if (write_bf16) {
    std::vector<uint16_t> bf16 = host_copy(dbf16, n);
    size_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += bf16[i] != to_bf16_bits(p[i]);
    EXPECT_EQ(bad, 0u) << "bf16 copy of the parameter";
    CUDA_OK(cudaFree(dbf16_alloc));
  }
  CUDA_OK(cudaFree(dp_alloc));
  CUDA_OK(cudaFree(dm_alloc));
  CUDA_OK(cudaFree(dv_alloc));
  CUDA_OK(cudaStreamDestroy(stream));
}

TEST(AdamWCuda, Fp32GradientsMatchTheCpuKernelBitForBit) {
  run_parity(GradType::kFloat32, false);
}

TEST(AdamWCuda, Bf16GradientsAndBf16ParamCopyMatchTheCpuKernel) {
  run_parity(GradType::kBFloat16, true);
}

TEST(AdamWCuda, MisalignedArraysMatchTheCpuKernelBitForBit) {
  run_parity(GradType::kFloat32, true, /*skip=*/1);
  run_parity(GradType::kBFloat16, false, /*skip=*/1);
}

}  // namespace
}  // namespace dstrain::kernels
