#pragma once
// Per-element math shared by the CUDA kernels (kernels/fused_ops.cu) and their CPU references
// (kernels/fused_ops_reference.cpp), so that both compute the same expressions.

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DSTRAIN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DSTRAIN_HOST_DEVICE inline
#endif

namespace dstrain::kernels::math {

// One pair (x1, x2) = (x[d], x[d + dim/2]) of a head, with c1/c2, s1/s2 the tables at d and
// d + dim/2. See RopeArgs.
DSTRAIN_HOST_DEVICE void rope_pair(float x1, float x2, float c1, float c2, float s1, float s2,
                                   bool inverse, float& out1, float& out2) {
  if (inverse) {
    out1 = x1 * c1 + x2 * s2;
    out2 = x2 * c2 - x1 * s1;
  } else {
    out1 = x1 * c1 - x2 * s1;
    out2 = x2 * c2 + x1 * s2;
  }
}

DSTRAIN_HOST_DEVICE float sigmoid(float g) {
  return 1.0f / (1.0f + expf(-g));
}

DSTRAIN_HOST_DEVICE float swiglu(float gate, float up) {
  return gate * sigmoid(gate) * up;
}

DSTRAIN_HOST_DEVICE void swiglu_backward(float grad, float gate, float up, float& grad_gate,
                                         float& grad_up) {
  const float s = sigmoid(gate);
  grad_up = grad * gate * s;
  grad_gate = grad * up * s * (1.0f + gate * (1.0f - s));
}

// RMSNorm: 1 / sqrt(mean + eps) of a row's sum of squares over n elements.
DSTRAIN_HOST_DEVICE float rms_rstd(float sum_of_squares, int64_t n, float eps) {
  return 1.0f / sqrtf(sum_of_squares / static_cast<float>(n) + eps);
}

// One element of RMSNorm's input gradient: with coefficient = rstd³ · mean(weight·g·sum) of the
// row, grad_sum (the residual's gradient, 0 without) + rstd·weight·g − sum·coefficient.
DSTRAIN_HOST_DEVICE float rms_norm_grad(float grad_sum, float grad, float weight, float sum,
                                        float rstd, float coefficient) {
  return grad_sum + rstd * weight * grad - sum * coefficient;
}

DSTRAIN_HOST_DEVICE float rms_norm_coefficient(float dot, int64_t n, float rstd) {
  return rstd * rstd * rstd * dot / static_cast<float>(n);
}

// Online softmax normaliser: (max, sum of exp(x - max)) of a set, merged with another set's.
DSTRAIN_HOST_DEVICE void softmax_merge(float& max, float& sum, float other_max, float other_sum) {
  if (other_max > max) {
    sum = sum * expf(max - other_max) + other_sum;
    max = other_max;
  } else if (other_sum > 0.0f) {
    sum += other_sum * expf(other_max - max);
  }
}

}  // namespace dstrain::kernels::math
