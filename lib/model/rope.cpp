#include "model/rope.h"

#include <cmath>

namespace dstrain::model {
namespace {

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

}  // namespace

torch::Tensor rope_inv_freq(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  const torch::Tensor exponent = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim;
  torch::Tensor inv_freq = 1.0 / torch::pow(config.rope_theta, exponent);
  const RopeScaling& s = config.rope_scaling;
  if (s.type == "linear") inv_freq = inv_freq / s.factor;
  if (s.type == "llama3") inv_freq = llama3_scale(inv_freq, s);
  return inv_freq;
}

std::pair<torch::Tensor, torch::Tensor> rope_tables(const torch::Tensor& inv_freq,
                                                    int64_t seq_len) {
  const torch::Tensor pos =
      torch::arange(seq_len, torch::TensorOptions().dtype(torch::kFloat).device(inv_freq.device()));
  const torch::Tensor freqs = torch::outer(pos, inv_freq);   // [T, D/2]
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);  // [T, D]
  return {emb.cos(), emb.sin()};
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace dstrain::model
