// LoRA on q_proj and v_proj with the fused q/k/v product (model/fused_qkv.h): the adapters' deltas
// are added per projection after the one product, so the attention output and every gradient (x,
// base weights and biases, lora_A, lora_B) equal the three projections' up to float rounding (d x
// is summed in another order), fp32 and bf16, with and without biases, weights back to back or
// apart.
#include <gtest/gtest.h>

#include "lora/lora_model.h"
#include "lora_test_util.h"
#include "model/fused_qkv.h"
#include "model/layers.h"
#include "model/model.h"
#include "tests/unit/model/attention_pass.h"

namespace dstrain::lora {
namespace {

struct Case {
  const char* model_type;  // llama: no bias; qwen2: q/k/v biases
  torch::ScalarType dtype;
  bool adjacent;
};

class FusedQkvLora : public ::testing::TestWithParam<Case> {};

TEST_P(FusedQkvLora, GivesTheThreeProjectionsOutputAndEveryGradient) {
  const auto [model_type, dtype, adjacent] = GetParam();
  const model::ModelConfig c = model::testing::small_config(model_type);
  model::DecoderModel m = model::build_model(c, torch::kFloat, 2);
  LoraModel lora(m, testing::small_options({"q_proj", "v_proj"}), "test");
  testing::randomize_b(lora, 3);
  m->to(dtype);
  std::vector<std::pair<std::string, torch::Tensor>> adapters;
  for (auto& [name, t] : lora.named_parameters()) {
    if (name.find("layers.0.") == std::string::npos) continue;
    t.set_data(t.detach().to(dtype));
    adapters.emplace_back(name, t);
  }
  ASSERT_EQ(adapters.size(), 4u);  // A and B of q_proj and v_proj
  std::shared_ptr<model::AttentionImpl> attn;
  for (const auto& module : m->modules()) {
    if (!attn) attn = std::dynamic_pointer_cast<model::AttentionImpl>(module);
  }
  ASSERT_TRUE(attn);
  if (adjacent) {
    model::testing::place_back_to_back(
        {attn->q_proj->weight, attn->k_proj->weight, attn->v_proj->weight});
  }
  EXPECT_EQ(
      model::adjacent_rows({attn->q_proj->weight, attn->k_proj->weight, attn->v_proj->weight}),
      adjacent);
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({2, 10, c.hidden_size}).to(dtype);
  const torch::Tensor dy = torch::randn({2, 10, c.hidden_size}).to(dtype);
  const auto three = model::testing::attention_pass(c, *attn, x, dy, /*fused=*/false, adapters);
  const auto fused = model::testing::attention_pass(c, *attn, x, dy, /*fused=*/true, adapters);
  EXPECT_EQ(three.count("q_proj.bias"), c.qkv_bias ? 1u : 0u);
  EXPECT_GT(three.at(adapters[0].first).abs().max().item<double>(), 0) << "no gradient for A";
  model::testing::expect_close(three, fused, dtype == torch::kFloat ? 2e-6 : 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Cases, FusedQkvLora,
                         ::testing::Values(Case{"llama", torch::kFloat, false},
                                           Case{"llama", torch::kFloat, true},
                                           Case{"llama", torch::kBFloat16, true},
                                           Case{"qwen2", torch::kFloat, false},
                                           Case{"qwen2", torch::kBFloat16, false}),
                         [](const auto& info) {
                           return std::string(info.param.model_type) +
                                  (info.param.dtype == torch::kFloat ? "_fp32" : "_bf16") +
                                  (info.param.adjacent ? "_adjacent" : "_apart");
                         });

}  // namespace
}  // namespace dstrain::lora
