// CPU references of the fused kernels: plain loops over float32 with the kernels' own per-element
// math, in the order a CUDA thread computes it.

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "kernels/fused_ops.h"
#include "kernels/fused_ops_math.h"

namespace dstrain::kernels {
namespace {

void require_float32(ElementType type, const char* what) {
  if (type != ElementType::kFloat32) {
    fail(ErrorKind::kInternal, "{}: the CPU reference computes float32 arrays only", what);
  }
}

}  // namespace

void rope_reference(const RopeArgs& a) {
  require_float32(a.type, "rope_reference");
  const auto* x = static_cast<const float*>(a.x);
  const auto* cos = static_cast<const float*>(a.cos);
  const auto* sin = static_cast<const float*>(a.sin);
  auto* out = static_cast<float*>(a.out);
  const int64_t half = a.dim / 2;
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t t = 0; t < a.seq_len; ++t) {
      for (int64_t h = 0; h < a.heads; ++h) {
        const int64_t in = b * a.batch_stride + t * a.seq_stride + h * a.head_stride;
        const int64_t o = ((b * a.seq_len + t) * a.heads + h) * a.dim;
        for (int64_t d = 0; d < half; ++d) {
          const int64_t c = t * a.dim + d;
          math::rope_pair(x[in + d], x[in + d + half], cos[c], cos[c + half], sin[c], sin[c + half],
                          a.inverse, out[o + d], out[o + d + half]);
        }
      }
    }
  }
}

void swiglu_reference(const SwigluArgs& a) {
  require_float32(a.type, "swiglu_reference");
  const auto* gate = static_cast<const float*>(a.gate);
  const auto* up = static_cast<const float*>(a.up);
  auto* out = static_cast<float*>(a.out);
  for (int64_t i = 0; i < a.n; ++i) out[i] = math::swiglu(gate[i], up[i]);
}

void swiglu_backward_reference(const SwigluBackwardArgs& a) {
  require_float32(a.type, "swiglu_backward_reference");
  const auto* grad = static_cast<const float*>(a.grad);
  const auto* gate = static_cast<const float*>(a.gate);
  const auto* up = static_cast<const float*>(a.up);
  auto* grad_gate = static_cast<float*>(a.grad_gate);
  auto* grad_up = static_cast<float*>(a.grad_up);
  for (int64_t i = 0; i < a.n; ++i) {
    math::swiglu_backward(grad[i], gate[i], up[i], grad_gate[i], grad_up[i]);
  }
}

void cross_entropy_reference(const CrossEntropyArgs& a) {
  require_float32(a.type, "cross_entropy_reference");
  for (int64_t row = 0; row < a.rows; ++row) {
    float* x = static_cast<float*>(a.logits) + row * a.vocab;
    const int64_t label = a.labels[row];
    const bool ignored = label == a.ignore_index;
    float max = -std::numeric_limits<float>::infinity(), sum = 0.0f;
    for (int64_t v = 0; v < a.vocab; ++v) math::softmax_merge(max, sum, x[v], 1.0f);
    if (ignored) {
      a.loss[row] = 0.0f;
    } else if (label < 0 || label >= a.vocab) {
      a.loss[row] = std::numeric_limits<float>::quiet_NaN();
    } else {
      a.loss[row] = std::log(sum) + max - x[label];
    }
    if (!a.write_grad) continue;
    for (int64_t v = 0; v < a.vocab; ++v) {
      x[v] = ignored ? 0.0f : std::exp(x[v] - max) / sum - (v == label ? 1.0f : 0.0f);
    }
  }
}

void add_rms_norm_reference(const AddRmsNormArgs& a) {
  require_float32(a.type, "add_rms_norm_reference");
  const auto* weight = static_cast<const float*>(a.weight);
  for (int64_t row = 0; row < a.rows; ++row) {
    const int64_t o = row * a.hidden;
    const auto* x = static_cast<const float*>(a.x) + o;
    const auto* delta = static_cast<const float*>(a.delta) + o;
    auto* sum = static_cast<float*>(a.sum) + o;
    auto* out = static_cast<float*>(a.out) + o;
    float squares = 0.0f;
    for (int64_t j = 0; j < a.hidden; ++j) {
      sum[j] = x[j] + delta[j];
      squares += sum[j] * sum[j];
    }
    const float rstd = math::rms_rstd(squares, a.hidden, a.eps);
    a.rstd[row] = rstd;
    for (int64_t j = 0; j < a.hidden; ++j) out[j] = weight[j] * (sum[j] * rstd);
  }
}

void add_rms_norm_backward_reference(const AddRmsNormBackwardArgs& a) {
  require_float32(a.type, "add_rms_norm_backward_reference");
  const auto* weight = static_cast<const float*>(a.weight);
  auto* grad_weight = static_cast<float*>(a.grad_weight);
  if (grad_weight != nullptr) std::fill(grad_weight, grad_weight + a.hidden, 0.0f);
  for (int64_t row = 0; row < a.rows; ++row) {
    const int64_t o = row * a.hidden;
    const auto* grad = static_cast<const float*>(a.grad_out) + o;
    const auto* grad_sum = a.grad_sum ? static_cast<const float*>(a.grad_sum) + o : nullptr;
    const auto* sum = static_cast<const float*>(a.sum) + o;
    auto* grad_in = static_cast<float*>(a.grad_in) + o;
    const float rstd = a.rstd[row];
    float dot = 0.0f;
    for (int64_t j = 0; j < a.hidden; ++j) dot += weight[j] * grad[j] * sum[j];
    const float coefficient = math::rms_norm_coefficient(dot, a.hidden, rstd);
    for (int64_t j = 0; j < a.hidden; ++j) {
      grad_in[j] = math::rms_norm_grad(grad_sum ? grad_sum[j] : 0.0f, grad[j], weight[j], sum[j],
                                       rstd, coefficient);
      if (grad_weight != nullptr) grad_weight[j] += grad[j] * sum[j] * rstd;
    }
  }
}

}  // namespace dstrain::kernels
