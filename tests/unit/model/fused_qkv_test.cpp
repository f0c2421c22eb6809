// q/k/v as one matrix product (fused_qkv.h) against the three projections: the attention output
// and every gradient (x, weights, biases) in fp32 and bf16, with biases (qwen2) and without
// (llama), with the three weights back to back in one buffer (the fused weight is a view) and
// apart (it is concatenated), and whole models inside activation checkpointing.
//
// Tolerances: the products and the weight/bias gradients are the same sums either way; d x is not
// (one reduction over H·D + 2·KV·D products against three reductions added up), so results differ
// by float rounding: a few float32 ulps, a few bfloat16 ulps.
#include "model/fused_qkv.h"

#include <array>
#include <map>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "model/activation_checkpoint.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/rope.h"
#include "test_util.h"
#include "tests/unit/model/attention_pass.h"
#include "tests/unit/model/counting_allocator.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model {
namespace {

using testing::attention_pass;
using testing::expect_close;
using testing::expect_same_training;
using testing::LossAndGrads;
using testing::place_back_to_back;
using testing::random_ids;
using testing::relative_difference;
using testing::small_config_json;
using testing::train_pass;

// Tolerance (relative to the largest element) for a result that only float rounding separates.
double rounding_tolerance(torch::ScalarType dtype) {
  return dtype == torch::kFloat ? 2e-6 : 2e-2;
}

TEST(FusedQkv, AdjacentRowsMeansOneStorageBackToBackInOrder) {
  const torch::Tensor flat = torch::randn({10 * 4});
  const auto rows = [&](int64_t begin, int64_t n) {
    return flat.narrow(0, 4 * begin, 4 * n).view({n, 4});
  };
  EXPECT_TRUE(adjacent_rows({rows(0, 3), rows(3, 2), rows(5, 5)}));
  EXPECT_FALSE(adjacent_rows({rows(0, 3), rows(4, 2), rows(6, 4)})) << "a gap";
  EXPECT_FALSE(adjacent_rows({rows(3, 2), rows(0, 3), rows(5, 5)})) << "out of order";
  EXPECT_FALSE(adjacent_rows({rows(0, 3), rows(3, 2).clone(), rows(5, 5)})) << "another storage";
  EXPECT_FALSE(adjacent_rows({torch::randn({3, 4}), torch::randn({2, 4})}));
  EXPECT_FALSE(adjacent_rows({rows(0, 3), flat.narrow(0, 12, 10).view({2, 5})})) << "widths";
  EXPECT_TRUE(adjacent_rows({flat.narrow(0, 0, 3), flat.narrow(0, 3, 7)})) << "biases";
}

struct QkvCase {
  const char* model_type;  // llama: no bias; qwen2: q/k/v biases
  torch::ScalarType dtype;
  bool adjacent;  // q/k/v weights (and biases) back to back in one buffer
};

std::string case_name(const ::testing::TestParamInfo<QkvCase>& info) {
  return std::string(info.param.model_type) +
         (info.param.dtype == torch::kFloat ? "_fp32" : "_bf16") +
         (info.param.adjacent ? "_adjacent" : "_apart");
}

// An attention module of `model_type`'s small config in `dtype` (LibTorch's default initialisation:
// biases are not zero), its q/k/v weights and biases moved into one buffer when `adjacent`.
Attention make_attention(const ModelConfig& c, torch::ScalarType dtype, bool adjacent) {
  torch::manual_seed(3);
  Attention attn(c, std::nullopt, Materialize::kYes);
  attn->to(dtype);
  if (adjacent) {
    place_back_to_back({attn->q_proj->weight, attn->k_proj->weight, attn->v_proj->weight});
    if (c.qkv_bias)
      place_back_to_back({attn->q_proj->bias, attn->k_proj->bias, attn->v_proj->bias});
  }
  return attn;
}

bool weights_adjacent(AttentionImpl& attn) {
  return adjacent_rows({attn.q_proj->weight, attn.k_proj->weight, attn.v_proj->weight});
}

class FusedQkvAttention : public ::testing::TestWithParam<QkvCase> {};

TEST_P(FusedQkvAttention, GivesTheThreeProjectionsOutputAndEveryGradient) {
  const ModelConfig c = parse_model_config(small_config_json(GetParam().model_type));
  const torch::ScalarType dtype = GetParam().dtype;
  Attention attn = make_attention(c, dtype, GetParam().adjacent);
  EXPECT_EQ(weights_adjacent(*attn), GetParam().adjacent);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({2, 10, c.hidden_size}).to(dtype);
  const torch::Tensor dy = torch::randn({2, 10, c.hidden_size}).to(dtype);
  const auto three = attention_pass(c, *attn, x, dy, /*fused=*/false);
  const auto fused = attention_pass(c, *attn, x, dy, /*fused=*/true);
  EXPECT_EQ(three.count("q_proj.bias"), c.qkv_bias ? 1u : 0u);
  expect_close(three, fused, rounding_tolerance(dtype));
  EXPECT_EQ(weights_adjacent(*attn), GetParam().adjacent) << "the layout changed";
}

INSTANTIATE_TEST_SUITE_P(Cases, FusedQkvAttention,
                         ::testing::Values(QkvCase{"llama", torch::kFloat, false},
                                           QkvCase{"llama", torch::kFloat, true},
                                           QkvCase{"llama", torch::kBFloat16, false},
                                           QkvCase{"llama", torch::kBFloat16, true},
                                           QkvCase{"qwen2", torch::kFloat, false},
                                           QkvCase{"qwen2", torch::kFloat, true},
                                           QkvCase{"qwen2", torch::kBFloat16, false},
                                           QkvCase{"qwen2", torch::kBFloat16, true}),
                         case_name);

// Bytes the CPU allocator holds after q/k/v of x were computed (their graph kept), above what it
// held before.
int64_t bytes_held_after_qkv(AttentionImpl& attn, const torch::Tensor& x, bool fused) {
  testing::CountingScope scope;
  const int64_t before = scope.counter().current();
  std::array<torch::Tensor, 3> qkv;
  if (fused) {
    const QkvOutputs y = fused_qkv(x, *attn.q_proj, *attn.k_proj, *attn.v_proj);
    qkv = {y.q, y.k, y.v};
  } else {
    qkv = {attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)};
  }
  const int64_t held = scope.counter().current() - before;
  (qkv[0].sum() + qkv[1].sum() + qkv[2].sum()).backward();
  return held;
}

TEST(FusedQkv, KeepsNoConcatenatedWeightForBackward) {
  // Apart, the forward concatenates the weights ([H·D + 2·KV·D, C], here larger than the outputs);
  // the graph must hold what the three projections' graphs hold: the outputs, nothing more.
  nlohmann::json doc = small_config_json("qwen2");
  doc["hidden_size"] = 256;
  doc["head_dim"] = 64;
  const ModelConfig c = parse_model_config(doc);
  Attention attn = make_attention(c, torch::kFloat, /*adjacent=*/false);
  const torch::Tensor x = torch::randn({1, 4, c.hidden_size}).requires_grad_();
  const int64_t three = bytes_held_after_qkv(*attn, x, /*fused=*/false);
  const int64_t fused = bytes_held_after_qkv(*attn, x, /*fused=*/true);
  const int64_t weight_bytes = 3 * attn->k_proj->weight.nbytes();
  EXPECT_GT(three, 0);
  EXPECT_LE(fused, three) << "fused q/k/v holds " << fused - three
                          << " more bytes (a weight copy is " << weight_bytes << ")";
  EXPECT_TRUE(attn->q_proj->weight.grad().defined() && attn->v_proj->bias.grad().defined());
}

// A model of `model_type` (qwen3: q_norm/k_norm; qwen2 here with a sliding window on layer 0) in
// `dtype` with its biases and norms moved off their initial values.
DecoderModel make_model(const std::string& model_type, torch::ScalarType dtype) {
  nlohmann::json doc = small_config_json(model_type);
  doc["num_hidden_layers"] = 3;
  if (model_type == "qwen3") doc["head_dim"] = 16;
  if (model_type == "qwen2") {
    doc["use_sliding_window"] = true;
    doc["sliding_window"] = 4;
    doc["max_window_layers"] = 1;
  }
  DecoderModel m = build_model(parse_model_config(doc), dtype, 3);
  torch::NoGradGuard no_grad;
  torch::manual_seed(11);
  for (auto& item : m->named_parameters()) {
    const std::string& name = item.key();
    if (name.find("bias") != std::string::npos || name.find("norm") != std::string::npos)
      item.value().add_(torch::randn_like(item.value()) * 0.3);
  }
  return m;
}

class FusedQkvModel : public ::testing::TestWithParam<std::pair<const char*, torch::ScalarType>> {};

TEST_P(FusedQkvModel, TrainsLikeTheThreeProjectionsPlainAndCheckpointed) {
  const auto [model_type, dtype] = GetParam();
  DecoderModel m = make_model(model_type, dtype);
  const torch::Tensor ids = random_ids(2, 16, 97, 9);
  const LossAndGrads three = train_pass(*m, ids);
  LossAndGrads fused, fused_checkpointed;
  {
    FusedQkvEverywhere force;
    fused = train_pass(*m, ids);
    m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
    fused_checkpointed = train_pass(*m, ids);
  }
  // bf16: d x differs in its last bits from the first layer's backward on, and a 3-layer bf16
  // network carries that to a few percent of the largest gradient element.
  const double tol = dtype == torch::kFloat ? 1e-5 : 6e-2;
  expect_same_training(three, fused, tol);
  // The recompute takes the fused path too, on the same inputs.
  expect_same_training(fused, fused_checkpointed, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Families, FusedQkvModel,
    ::testing::Values(std::pair{"llama", torch::kFloat}, std::pair{"llama", torch::kBFloat16},
                      std::pair{"qwen2", torch::kFloat}, std::pair{"qwen2", torch::kBFloat16},
                      std::pair{"qwen3", torch::kFloat}, std::pair{"qwen3", torch::kBFloat16}),
    [](const auto& info) {
      return std::string(info.param.first) +
             (info.param.second == torch::kFloat ? "_fp32" : "_bf16");
    });

}  // namespace
}  // namespace dstrain::model
