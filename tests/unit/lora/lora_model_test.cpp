// LoRA adapters on the decoder: PEFT's initialisation, y = W·x + B·A·dropout(x)·scale, and merging.
#include <gtest/gtest.h>

#include <cmath>

#include "lora/lora_model.h"
#include "tests/unit/lora/lora_test_util.h"

namespace dstrain::lora::testing {
namespace {

torch::Tensor all_a(const LoraModel& lora) {
  std::vector<torch::Tensor> parts;
  for (const auto& w : lora.weights()) parts.push_back(w.A.flatten());
  return torch::cat(parts);
}

TEST(LoraInit, DefaultIsKaimingUniformAAndZeroBDeterministicBySeed) {
  auto m = small_model();
  LoraModel lora(m, small_options(), "k");
  ASSERT_EQ(lora.weights().size(), 4u);
  for (const auto& w : lora.weights()) {
    EXPECT_EQ(w.A.sizes(), (std::vector<int64_t>{4, 64}));
    EXPECT_TRUE(w.A.requires_grad());
    EXPECT_EQ(w.B.abs().max().item<float>(), 0.0f);
  }
  // kaiming_uniform(a=√5) on fan_in 64: U(-1/8, 1/8).
  const torch::Tensor a = all_a(lora);
  EXPECT_LE(a.abs().max().item<float>(), 0.125f);
  EXPECT_GT(a.abs().max().item<float>(), 0.12f);
  EXPECT_NEAR(a.pow(2).mean().item<float>(), 0.125 * 0.125 / 3, 0.0015);

  auto m2 = small_model();
  LoraModel same(m2, small_options(), "k");
  EXPECT_TRUE(torch::equal(all_a(same), a));
  LoraOptions other = small_options();
  other.seed = 12;
  auto m3 = small_model();
  LoraModel different(m3, other, "k");
  EXPECT_FALSE(torch::equal(all_a(different), a));
}

TEST(LoraInit, GaussianAHasStandardDeviationOneOverR) {
  LoraOptions o = small_options({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"});
  o.init = "gaussian";
  auto m = small_model();
  LoraModel lora(m, o, "k");
  const torch::Tensor a = all_a(lora);
  EXPECT_NEAR(a.std().item<float>(), 0.25, 0.025);
  EXPECT_NEAR(a.mean().item<float>(), 0.0, 0.02);
  o.init = "orthogonal";
  expect_error([&] { LoraModel bad(small_model(), o, "run.yaml"); }, ErrorKind::kConfig,
               {"run.yaml", "lora.init", "orthogonal"});
}

TEST(LoraInit, ScaleIsAlphaOverROrOverSqrtRWithRsLora) {
  LoraOptions o;
  o.r = 16;
  o.alpha = 32;
  EXPECT_DOUBLE_EQ(o.scale(), 2.0);
  o.use_rslora = true;
  EXPECT_DOUBLE_EQ(o.scale(), 8.0);
}

// The adapted model in fp32 against the base with ΔW = B·A·scale merged in.
void expect_merged_logits_equal(bool rslora) {
  torch::NoGradGuard no_grad;
  LoraOptions o =
      small_options({"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"});
  o.use_rslora = rslora;
  auto adapted = small_model(3);
  LoraModel lora(adapted, o, "k");
  randomize_b(lora, 9);
  adapted->eval();
  const torch::Tensor ids = input_ids();
  const torch::Tensor with_adapter = adapted->forward(ids);

  auto merged = small_model(3);
  const torch::Tensor base = merged->forward(ids);
  merge_lora(*merged, lora.weights(), o);
  const torch::Tensor out = merged->forward(ids);
  EXPECT_GT((with_adapter - base).abs().max().item<float>(), 1e-2) << "the adapter changes nothing";
  EXPECT_LT((with_adapter - out).abs().max().item<float>(), 1e-5);
}

TEST(LoraMerge, MergedModelLogitsEqualBasePlusAdapterLogits) {
  expect_merged_logits_equal(false);
}

TEST(LoraMerge, MergedModelLogitsEqualBasePlusAdapterLogitsWithRsLora) {
  expect_merged_logits_equal(true);
}

TEST(LoraForward, DropoutActsOnTheAdapterInputInTrainingOnly) {
  torch::NoGradGuard no_grad;
  LoraOptions o = small_options();
  o.dropout = 0.5;
  auto m = small_model();
  LoraModel lora(m, o, "k");
  randomize_b(lora, 4);
  const torch::Tensor ids = input_ids();
  m->eval();
  const torch::Tensor eval1 = m->forward(ids);
  const torch::Tensor eval2 = m->forward(ids);
  EXPECT_TRUE(torch::equal(eval1, eval2));
  m->train();
  const torch::Tensor train1 = m->forward(ids);
  EXPECT_GT((train1 - eval1).abs().max().item<float>(), 1e-4);
  // Without an adapter delta (B = 0) dropout has nothing to act on: the base path has none.
  for (const auto& w : lora.weights()) w.B.zero_();
  auto base = small_model();
  base->eval();
  EXPECT_TRUE(torch::equal(m->forward(ids), base->forward(ids)));
}

TEST(LoraModel, DestroyingItRemovesTheAdapters) {
  torch::NoGradGuard no_grad;
  auto m = small_model();
  const torch::Tensor ids = input_ids();
  const torch::Tensor base = m->forward(ids);
  {
    LoraModel lora(m, small_options(), "k");
    randomize_b(lora, 2);
    EXPECT_FALSE(torch::equal(m->forward(ids), base));
  }
  EXPECT_TRUE(torch::equal(m->forward(ids), base));
}

TEST(LoraModel, ParametersAreTheAdaptersOnlyWithPeftNames) {
  auto m = small_model();
  const size_t base_count = m->named_parameters().size();
  LoraModel lora(m, small_options(), "k");
  EXPECT_EQ(m->named_parameters().size(), base_count);
  const auto p = lora.named_parameters();
  ASSERT_EQ(p.size(), 8u);
  EXPECT_EQ(p[0].first, "model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(p[1].first, "model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(p[1].second.sizes(), (std::vector<int64_t>{64, 4}));
  EXPECT_EQ(p[3].second.sizes(), (std::vector<int64_t>{32, 4}));
  EXPECT_EQ(lora.num_parameters(), 2 * (4 * 64 + 64 * 4) + 2 * (4 * 64 + 32 * 4));
}

// --- adapters on expert stacks (PEFT's target_parameters) ----------------------------------------

TEST(LoraExperts, BothStacksNestAsPeftWrapsThemWithItsLayouts) {
  auto m = moe_model();
  // The list's order does not matter: PEFT wraps in the module's parameter order.
  LoraModel lora(m, stack_options({"experts.down_proj", "mlp.experts.gate_up_proj"}), "k");
  EXPECT_EQ(lora.modules(), (std::vector<std::string>{
                                "model.layers.0.self_attn.q_proj",
                                "model.layers.0.mlp.experts.base_layer",  // gate_up_proj
                                "model.layers.0.mlp.experts",             // down_proj
                                "model.layers.1.self_attn.q_proj",
                                "model.layers.1.mlp.experts.base_layer",
                                "model.layers.1.mlp.experts",
                            }));
  const auto w = lora.weights();
  // gate_up_proj [4, 32, 64]: A [r·E, in] = [16, 64], B [out, r·E] = [32, 16]; down_proj
  // [4, 64, 16]: A [16, 16], B [64, 16].
  EXPECT_EQ(w[1].A.sizes(), (std::vector<int64_t>{16, 64}));
  EXPECT_EQ(w[1].B.sizes(), (std::vector<int64_t>{32, 16}));
  EXPECT_EQ(w[2].A.sizes(), (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(w[2].B.sizes(), (std::vector<int64_t>{64, 16}));
  EXPECT_EQ(lora.named_parameters()[2].first,
            "model.layers.0.mlp.experts.base_layer.lora_A.weight");
  // One stack: its adapter at the module's own path.
  auto one = moe_model();
  LoraModel down(one, stack_options({"down_proj"}), "k");
  EXPECT_EQ(down.modules()[1], "model.layers.0.mlp.experts");
  EXPECT_EQ(down.weights()[1].B.sizes(), (std::vector<int64_t>{64, 16}));
}

TEST(LoraExperts, EachExpertGetsItsOwnBTimesAAndTheMergeEqualsTheAdapter) {
  torch::NoGradGuard no_grad;
  const LoraOptions o = stack_options({"mlp.experts.gate_up_proj", "mlp.experts.down_proj"});
  auto adapted = moe_model(3);
  LoraModel lora(adapted, o, "k");
  randomize_b(lora, 9);
  adapted->eval();
  const torch::Tensor ids = input_ids();
  const torch::Tensor with_adapter = adapted->forward(ids);

  auto merged = moe_model(3);
  const torch::Tensor base = merged->forward(ids);
  const torch::Tensor before =
      merged->named_parameters()["model.layers.1.mlp.experts.down_proj"].clone();
  merge_lora(*merged, lora.weights(), o);
  EXPECT_GT((with_adapter - base).abs().max().item<float>(), 1e-2) << "the adapter changes nothing";
  EXPECT_LT((with_adapter - merged->forward(ids)).abs().max().item<float>(), 1e-5);
  // PEFT's layout: expert e's A rows e·r.., B columns e, E + e, ...
  const LoraWeights w = lora.weights().back();  // layer 1's down_proj
  ASSERT_EQ(w.module, "model.layers.1.mlp.experts");
  const torch::Tensor after = merged->named_parameters()["model.layers.1.mlp.experts.down_proj"];
  const int64_t E = 4, r = o.r;
  for (int64_t e = 0; e < E; ++e) {
    const torch::Tensor delta =
        torch::matmul(w.B.index_select(1, torch::arange(e, r * E, E)), w.A.narrow(0, e * r, r)) *
        o.scale();
    EXPECT_LT((after[e] - before[e] - delta).abs().max().item<float>(), 1e-6) << "expert " << e;
  }
}

TEST(LoraExperts, DropoutAndNamesThatAreNoExpertStackAreRefused) {
  LoraOptions o = stack_options({"mlp.experts.down_proj"});
  o.dropout = 0.1;
  expect_error([&] { LoraModel bad(moe_model(), o, "run.yaml"); }, ErrorKind::kConfig,
               {"run.yaml", "lora.dropout", "lora.target_parameters"});
  for (const std::string name : {"q_proj.weight", "mlp.gate.weight"}) {
    expect_error([&] { LoraModel bad(moe_model(), stack_options({name}), "run.yaml"); },
                 ErrorKind::kConfig, {"lora.target_parameters", name, "not an expert stack"});
  }
  expect_error([&] { LoraModel bad(moe_model(), stack_options({"experts.up_proj"}), "run.yaml"); },
               ErrorKind::kConfig, {"experts.up_proj", "matches no parameter"});
  expect_error([&] { LoraModel bad(small_model(), stack_options({"down_proj"}), "run.yaml"); },
               ErrorKind::kConfig, {"has no expert stacks"});
  // target_modules may be empty where target_parameters chooses.
  LoraOptions only = stack_options({"gate_up_proj"});
  only.target_modules.clear();
  auto m = moe_model();
  EXPECT_EQ(LoraModel(m, only, "k").modules().size(), 2u);
}

// --- modules trained whole (PEFT's modules_to_save): the routers ---------------------------------

TEST(LoraWhole, TheRoutersTrainedCopyDrivesTheForwardAndMergesAsTheWeight) {
  torch::NoGradGuard no_grad;
  LoraOptions o = small_options({"q_proj"});
  o.modules_to_save = {"gate"};  // PEFT's plain suffix match: each layer's mlp.gate
  auto adapted = moe_model(3);
  LoraModel lora(adapted, o, "k");
  EXPECT_EQ(lora.whole_modules(),
            (std::vector<std::string>{"model.layers.0.mlp.gate", "model.layers.1.mlp.gate"}));
  EXPECT_EQ(lora.modules().size(), 2u);  // the q_proj adapters
  const auto p = lora.named_parameters();
  ASSERT_EQ(p.size(), 6u);
  EXPECT_EQ(p[2].first, "model.layers.0.mlp.gate.modules_to_save.weight");
  const torch::Tensor ids = input_ids();
  adapted->eval();
  const torch::Tensor base = adapted->forward(ids);
  EXPECT_TRUE(torch::equal(adapted->forward(ids), base)) << "the copy starts at the base weight";
  for (const auto& w : lora.weights()) {
    if (w.is_whole()) w.whole.add_(torch::randn(w.whole.sizes()) * 0.5);
  }
  const torch::Tensor trained = adapted->forward(ids);
  EXPECT_GT((trained - base).abs().max().item<float>(), 1e-3) << "the forward ignores the copy";
  auto merged = moe_model(3);
  merge_lora(*merged, lora.weights(), o);
  merged->eval();
  EXPECT_LT((merged->forward(ids) - trained).abs().max().item<float>(), 1e-5);
}

TEST(LoraWhole, NamesThatSelectNoRouterAreRefused) {
  LoraOptions o = small_options({"q_proj"});
  o.modules_to_save = {"q_proj"};
  expect_error([&] { LoraModel bad(moe_model(), o, "run.yaml"); }, ErrorKind::kConfig,
               {"lora.modules_to_save", "'q_proj' selects module model.layers.0.self_attn.q_proj",
                "router"});
  o.modules_to_save = {"router"};
  expect_error([&] { LoraModel bad(moe_model(), o, "run.yaml"); }, ErrorKind::kConfig,
               {"'router' matches no module", "model.layers.0.mlp.gate"});
  o.modules_to_save = {"gate"};
  expect_error([&] { LoraModel bad(small_model(), o, "run.yaml"); }, ErrorKind::kConfig,
               {"has none"});
}

}  // namespace
}  // namespace dstrain::lora::testing
