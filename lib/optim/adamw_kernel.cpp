#include "optim/adamw_kernel.h"

#include <cmath>

namespace dstrain::optim {

// Built twice, for AVX2 and for baseline x86-64, picked at load time by the CPU (GCC ifunc).
// Without FMA contraction both round identically, so the choice never changes results.
__attribute__((target_clones("avx2", "default"))) void adamw_update(float* __restrict p,
                                                                    const float* __restrict g,
                                                                    float* __restrict m,
                                                                    float* __restrict v, int64_t n,
                                                                    const AdamWScalars& s) {
  const float beta1 = s.beta1, c1 = s.one_minus_beta1, beta2 = s.beta2, c2 = s.one_minus_beta2;
  const float eps = s.eps, decay = s.decay_factor, neg_step = -s.step_size, b2 = s.bias2_sqrt;
  for (int64_t i = 0; i < n; ++i) {
    const float grad = g[i];
    const float param = p[i] * decay;
    const float exp_avg = m[i] * beta1 + c1 * grad;
    const float exp_avg_sq = v[i] * beta2 + c2 * grad * grad;
    const float denom = std::sqrt(exp_avg_sq) / b2 + eps;
    m[i] = exp_avg;
    v[i] = exp_avg_sq;
    p[i] = param + neg_step * exp_avg / denom;
  }
}

}  // namespace dstrain::optim
