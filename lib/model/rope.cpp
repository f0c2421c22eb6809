#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace dstrain::model {
namespace {

// theta^(2i/D) for i < D/2, float32: the wavelengths / 2π of unscaled RoPE.
torch::Tensor position_freqs(double theta, int64_t dim) {
  const torch::Tensor exponent = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim;
  return torch::pow(theta, exponent);
}

// Llama 3.x: wavelengths longer than original_ctx / low_freq_factor are slowed by `factor`, shorter
// than original_ctx / high_freq_factor kept, and those in between interpolated smoothly.
torch::Tensor llama3_scale(const torch::Tensor& inv_freq, const RopeScaling& s) {
  const double ctx = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = ctx / s.low_freq_factor;
  const double high_freq_wavelen = ctx / s.high_freq_factor;
  const torch::Tensor wavelen = 2 * M_PI / inv_freq;
  torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  const torch::Tensor smooth =
      (ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  const torch::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const torch::Tensor medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
  return torch::where(medium, smoothed, scaled);
}

// YaRN: dimension d turns ctx / (2π·theta^(d/D)) times over the original context ctx. Dimensions
// below the one turning beta_fast times keep their frequency (extrapolation), those above the one
// turning beta_slow times are divided by factor (interpolation), with a linear ramp between. The
// ends are computed in double, the ramp in float32, as transformers does.
torch::Tensor yarn_inv_freq(double theta, int64_t dim, const RopeScaling& s) {
  const double ctx = static_cast<double>(s.original_max_position_embeddings);
  const auto dimension_turning = [&](double rotations) {
    return static_cast<double>(dim) * std::log(ctx / (rotations * 2 * M_PI)) /
           (2 * std::log(theta));
  };
  double low = dimension_turning(s.beta_fast);
  double high = dimension_turning(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // a one-dimension ramp would divide by zero
  const torch::Tensor pos_freqs = position_freqs(theta, dim);
  const torch::Tensor extrapolation = 1.0 / pos_freqs;
  const torch::Tensor interpolation = 1.0 / (s.factor * pos_freqs);
  const torch::Tensor ramp =
      ((torch::arange(dim / 2, torch::kFloat) - low) / (high - low)).clamp(0, 1);
  const torch::Tensor kept = 1 - ramp;  // share of extrapolation per frequency
  return interpolation * (1 - kept) + extrapolation * kept;
}

// Dynamic NTK: theta grows with the sequence beyond max_position_embeddings M. For T > M the base
// is a float32 tensor computed from T as an int64 tensor, as transformers computes it from the
// position ids; for T <= M its double arithmetic at T = M.
torch::Tensor dynamic_inv_freq(double theta, int64_t dim, int64_t max_positions, int64_t seq_len,
                               double factor) {
  const double power = static_cast<double>(dim) / static_cast<double>(dim - 2);
  const torch::Tensor exponent = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim;
  const auto M = static_cast<double>(max_positions);
  if (seq_len <= max_positions) {
    const double base = theta * std::pow(factor * M / M - (factor - 1), power);
    return 1.0 / torch::pow(base, exponent);
  }
  const torch::Tensor T = torch::scalar_tensor(seq_len, torch::kLong);
  const torch::Tensor base = (T * factor / M - (factor - 1)).pow(power) * theta;  // float32
  return 1.0 / torch::pow(base, exponent);
}

// transformers' get_mscale: the attention temperature YaRN pairs with a context `scale`.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

torch::Tensor rope_inv_freq(const ModelConfig& config, int64_t seq_len) {
  const int64_t dim = config.head_dim;
  const RopeScaling& s = config.rope_scaling;
  if (s.type == "yarn") return yarn_inv_freq(config.rope_theta, dim, s);
  if (s.type == "dynamic")
    return dynamic_inv_freq(config.rope_theta, dim, config.max_position_embeddings, seq_len,
                            s.factor);
  torch::Tensor inv_freq = 1.0 / position_freqs(config.rope_theta, dim);
  if (s.type == "linear") inv_freq = inv_freq / s.factor;
  if (s.type == "llama3") inv_freq = llama3_scale(inv_freq, s);
  return inv_freq;
}

double rope_attention_scaling(const ModelConfig& config) {
  const RopeScaling& s = config.rope_scaling;
  if (s.type != "yarn") return 1.0;
  if (s.attention_factor) return *s.attention_factor;
  if (s.mscale != 0.0 && s.mscale_all_dim != 0.0)
    return yarn_mscale(s.factor, s.mscale) / yarn_mscale(s.factor, s.mscale_all_dim);
  return yarn_mscale(s.factor, 1.0);
}

std::pair<torch::Tensor, torch::Tensor> rope_tables(const torch::Tensor& inv_freq, int64_t seq_len,
                                                    double scaling) {
  const torch::Tensor pos =
      torch::arange(seq_len, torch::TensorOptions().dtype(torch::kFloat).device(inv_freq.device()));
  const torch::Tensor freqs = torch::outer(pos, inv_freq);   // [T, D/2]
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);  // [T, D]
  if (scaling == 1.0) return {emb.cos(), emb.sin()};
  return {emb.cos() * scaling, emb.sin() * scaling};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace dstrain::model
