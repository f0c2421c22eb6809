#include "model/rope.h"

#include <cmath>

#include <gtest/gtest.h>

#include "test_util.h"

namespace dstrain::model {
namespace {

ModelConfig rope_config(int64_t head_dim) {
  auto doc = testing::small_config_json();
  doc["head_dim"] = head_dim;
  return parse_model_config(doc);
}

TEST(Rope, DefaultFrequencies) {
  const torch::Tensor f = rope_inv_freq(rope_config(4));  // 1/10000^(0/4), 1/10000^(2/4)
  ASSERT_EQ(f.sizes(), (c10::IntArrayRef{2}));
  EXPECT_NEAR(f[0].item<float>(), 1.0, 1e-7);
  EXPECT_NEAR(f[1].item<float>(), 0.01, 1e-8);
}

TEST(Rope, RotateHalfMatchesHandComputation) {
  // D = 4: element i pairs with i + 2; frequencies 1 and 0.01. x = (1, 2, 3, 4) at every position.
  const torch::Tensor inv_freq = rope_inv_freq(rope_config(4));
  auto [cos, sin] = rope_tables(inv_freq, 4);
  const torch::Tensor x =
      torch::tensor({1.f, 2.f, 3.f, 4.f}).view({1, 1, 1, 4}).expand({1, 1, 4, 4});
  const torch::Tensor y = apply_rope(x, cos, sin);
  for (int p = 0; p < 4; ++p) {
    const double a = p * 1.0, b = p * 0.01;
    const double expected[4] = {
        1 * std::cos(a) - 3 * std::sin(a), 2 * std::cos(b) - 4 * std::sin(b),
        3 * std::cos(a) + 1 * std::sin(a), 4 * std::cos(b) + 2 * std::sin(b)};
    for (int i = 0; i < 4; ++i)
      EXPECT_NEAR(y[0][0][p][i].item<float>(), expected[i], 1e-5) << "pos " << p << " elem " << i;
  }
}

TEST(Rope, RelativePositionOnly) {
  // q·k after RoPE depends only on the distance between positions.
  torch::manual_seed(0);
  const torch::Tensor inv_freq = rope_inv_freq(rope_config(8));
  auto [cos, sin] = rope_tables(inv_freq, 10);
  const torch::Tensor q = torch::randn({8}).expand({1, 1, 10, 8});
  const torch::Tensor k = torch::randn({8}).expand({1, 1, 10, 8});
  const torch::Tensor rq = apply_rope(q, cos, sin)[0][0], rk = apply_rope(k, cos, sin)[0][0];
  EXPECT_NEAR((rq[5] * rk[2]).sum().item<float>(), (rq[8] * rk[5]).sum().item<float>(), 1e-4);
}

TEST(Rope, LinearScalingDividesFrequencies) {
  auto doc = testing::small_config_json();
  doc["head_dim"] = 8;
  doc["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  const torch::Tensor scaled = rope_inv_freq(parse_model_config(doc));
  EXPECT_TRUE(torch::allclose(scaled, rope_inv_freq(rope_config(8)) / 4.0));
}

TEST(Rope, Llama3ScalingMatchesHandComputation) {
  // D = 8, theta 10000: frequencies 1, 0.1, 0.01, 0.001 (wavelengths 6.3, 62.8, 628, 6283).
  // Context 64, low/high factors 1/4: wavelength > 64 is divided by 8, < 16 kept, between blended.
  auto doc = testing::small_config_json();
  doc["head_dim"] = 8;
  doc["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 8.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 64}};
  const torch::Tensor f = rope_inv_freq(parse_model_config(doc));
  const double wavelen1 = 2 * M_PI / 0.1;
  const double smooth = (64.0 / wavelen1 - 1.0) / (4.0 - 1.0);
  const double blended = (1 - smooth) * 0.1 / 8.0 + smooth * 0.1;
  EXPECT_NEAR(f[0].item<float>(), 1.0, 1e-6);
  EXPECT_NEAR(f[1].item<float>(), blended, 1e-7);
  EXPECT_NEAR(f[2].item<float>(), 0.01 / 8.0, 1e-8);
  EXPECT_NEAR(f[3].item<float>(), 0.001 / 8.0, 1e-9);
}

}  // namespace
}  // namespace dstrain::model
