#include "model/rope.h"

#include <algorithm>
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
  const torch::Tensor f = rope_inv_freq(rope_config(4), 128);  // 1/10000^(0/4), 1/10000^(2/4)
  ASSERT_EQ(f.sizes(), (c10::IntArrayRef{2}));
  EXPECT_NEAR(f[0].item<float>(), 1.0, 1e-7);
  EXPECT_NEAR(f[1].item<float>(), 0.01, 1e-8);
}

TEST(Rope, RotateHalfMatchesHandComputation) {
  // D = 4: element i pairs with i + 2; frequencies 1 and 0.01. x = (1, 2, 3, 4) at every position.
  const torch::Tensor inv_freq = rope_inv_freq(rope_config(4), 128);
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
  const torch::Tensor inv_freq = rope_inv_freq(rope_config(8), 128);
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
  const torch::Tensor scaled = rope_inv_freq(parse_model_config(doc), 128);
  EXPECT_TRUE(torch::allclose(scaled, rope_inv_freq(rope_config(8), 128) / 4.0));
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
  const torch::Tensor f = rope_inv_freq(parse_model_config(doc), 128);
  const double wavelen1 = 2 * M_PI / 0.1;
  const double smooth = (64.0 / wavelen1 - 1.0) / (4.0 - 1.0);
  const double blended = (1 - smooth) * 0.1 / 8.0 + smooth * 0.1;
  EXPECT_NEAR(f[0].item<float>(), 1.0, 1e-6);
  EXPECT_NEAR(f[1].item<float>(), blended, 1e-7);
  EXPECT_NEAR(f[2].item<float>(), 0.01 / 8.0, 1e-8);
  EXPECT_NEAR(f[3].item<float>(), 0.001 / 8.0, 1e-9);
}

// YaRN by its formula, in double: D = 8, theta 10000, original context 64, factor 4. Dimension
// pair i has frequency theta^(-2i/8) = 1, 0.1, 0.01, 0.001 and turns 64·f/(2π) times over the
// context: 10.2, 1.02, 0.10, 0.01. The ramp's ends are the dimensions turning beta_fast = 32 and
// beta_slow = 1 times, d(r) = 8·ln(64/(2π·r)) / (2·ln 10000): -0.50 and 1.01, truncated to 0 and 2.
TEST(Rope, YarnMatchesItsFormula) {
  auto doc = testing::small_config_json();
  doc["head_dim"] = 8;
  doc["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 64}};
  const ModelConfig c = parse_model_config(doc);
  const torch::Tensor f = rope_inv_freq(c, 16);
  auto dim_turning = [](double r) {
    return 8 * std::log(64 / (2 * M_PI * r)) / (2 * std::log(1e4));
  };
  const double low = std::max(std::floor(dim_turning(32)), 0.0);
  const double high = std::min(std::ceil(dim_turning(1)), 7.0);
  ASSERT_EQ(low, 0.0);
  ASSERT_EQ(high, 2.0);
  for (int i = 0; i < 4; ++i) {
    const double freq = std::pow(1e4, -2.0 * i / 8);
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);  // share divided by factor
    const double want = freq / 4.0 * ramp + freq * (1 - ramp);
    EXPECT_NEAR(f[i].item<double>(), want, 1e-7 * freq) << i;
  }
  EXPECT_EQ(rope_inv_freq(c, 1000).sizes(), f.sizes());  // yarn does not depend on the length
  EXPECT_TRUE(torch::equal(rope_inv_freq(c, 1000), f));
  EXPECT_DOUBLE_EQ(rope_attention_scaling(c), 0.1 * std::log(4.0) + 1.0);
}

TEST(Rope, YarnWithoutTruncationRampsOverFractionalDimensions) {
  auto doc = testing::small_config_json();
  doc["head_dim"] = 8;
  doc["rope_scaling"] = {{"rope_type", "yarn"},
                         {"factor", 4.0},
                         {"original_max_position_embeddings", 64},
                         {"truncate", false}};
  const torch::Tensor f = rope_inv_freq(parse_model_config(doc), 16);
  const double high = 8 * std::log(64 / (2 * M_PI)) / (2 * std::log(1e4));  // 1.01, low 0
  const double ramp = 1.0 / high;                                           // at dimension 1
  EXPECT_NEAR(f[1].item<double>(), 0.1 / 4.0 * ramp + 0.1 * (1 - ramp), 1e-8);
  EXPECT_NEAR(f[2].item<double>(), 0.01 / 4.0, 1e-9);
}

TEST(Rope, YarnAttentionFactorFromConfigOrMscale) {
  auto doc = testing::small_config_json();
  doc["rope_scaling"] = {{"type", "yarn"}, {"factor", 40.0}, {"attention_factor", 0.5}};
  EXPECT_DOUBLE_EQ(rope_attention_scaling(parse_model_config(doc)), 0.5);
  doc["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 40.0}, {"mscale", 1.0}, {"mscale_all_dim", 0.707}};
  const double m1 = 0.1 * std::log(40.0) + 1.0, m2 = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(rope_attention_scaling(parse_model_config(doc)), m1 / m2);
  doc["rope_scaling"] = {{"type", "linear"}, {"factor", 40.0}};
  EXPECT_DOUBLE_EQ(rope_attention_scaling(parse_model_config(doc)), 1.0);
}

TEST(Rope, TablesAreScaledByTheAttentionFactor) {
  const torch::Tensor inv_freq = rope_inv_freq(rope_config(8), 128);
  auto [cos, sin] = rope_tables(inv_freq, 5);
  auto [cos2, sin2] = rope_tables(inv_freq, 5, 1.25);
  EXPECT_TRUE(torch::allclose(cos2, cos * 1.25));
  EXPECT_TRUE(torch::allclose(sin2, sin * 1.25));
}

// Dynamic NTK with max_position_embeddings M = 128, factor 2, D = 8: unscaled up to M positions;
// at T = 256, theta becomes 10000·(2·256/128 − 1)^(8/6).
TEST(Rope, DynamicRaisesThetaOnlyBeyondMaxPositions) {
  auto doc = testing::small_config_json();
  doc["head_dim"] = 8;
  doc["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  const ModelConfig c = parse_model_config(doc);
  const torch::Tensor plain = rope_inv_freq(rope_config(8), 128);
  EXPECT_TRUE(torch::allclose(rope_inv_freq(c, 100), plain, 1e-6, 0));
  EXPECT_TRUE(torch::allclose(rope_inv_freq(c, 128), plain, 1e-6, 0));
  const double theta = 1e4 * std::pow(3.0, 8.0 / 6.0);
  const torch::Tensor f = rope_inv_freq(c, 256);
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(f[i].item<double>(), std::pow(theta, -2.0 * i / 8),
                1e-6 * std::pow(theta, -2.0 * i / 8))
        << i;
  EXPECT_DOUBLE_EQ(rope_attention_scaling(c), 1.0);
}

}  // namespace
}  // namespace dstrain::model
