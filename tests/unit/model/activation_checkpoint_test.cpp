// Activation checkpointing: the same loss and gradients as the plain forward, one recompute per
// block, RNG replayed for the recompute, and a real drop in peak host memory.
#include "model/activation_checkpoint.h"

#include <algorithm>
#include <iostream>

#include <gtest/gtest.h>

#include "model/model.h"
#include "test_util.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model {
namespace {

using testing::expect_same_training;
using testing::LossAndGrads;
using testing::peak_training_bytes;
using testing::random_ids;
using testing::small_config_json;
using testing::train_pass;

struct CheckpointCase {
  const char* model_type;
  torch::ScalarType dtype;
};

class CheckpointedModel : public ::testing::TestWithParam<CheckpointCase> {};

TEST_P(CheckpointedModel, GivesTheSameLossAndEveryParameterGradient) {
  nlohmann::json doc = small_config_json(GetParam().model_type);
  doc["num_hidden_layers"] = 3;
  if (std::string(GetParam().model_type) == "qwen3") doc["head_dim"] = 16;
  DecoderModel m = build_model(parse_model_config(doc), GetParam().dtype, 3);
  const torch::Tensor ids = random_ids(2, 24, 97, 9);
  const LossAndGrads plain = train_pass(*m, ids);
  m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
  const LossAndGrads ckpt = train_pass(*m, ids);
  expect_same_training(plain, ckpt, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Families, CheckpointedModel,
                         ::testing::Values(CheckpointCase{"llama", torch::kFloat},
                                           CheckpointCase{"llama", torch::kBFloat16},
                                           CheckpointCase{"qwen3", torch::kFloat},
                                           CheckpointCase{"qwen3", torch::kBFloat16}),
                         [](const auto& info) {
                           return std::string(info.param.model_type) +
                                  (info.param.dtype == torch::kFloat ? "_fp32" : "_bf16");
                         });

std::string grad_fn_name(const torch::Tensor& t) {
  return t.grad_fn() ? t.grad_fn()->name() : "";
}

TEST(CheckpointedModel, ChecksLayersOnlyInTrainingWithGradEnabled) {
  DecoderModel m = build_model(testing::small_config(), torch::kFloat, 3);
  m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
  m->train();
  const torch::Tensor h = m->run_block(0, random_ids(1, 8, 97, 1), m->context(8));
  EXPECT_EQ(grad_fn_name(h).find("CheckpointFunction"), std::string::npos) << "the embedding";
  EXPECT_NE(grad_fn_name(m->run_block(1, h, m->context(8))).find("CheckpointFunction"),
            std::string::npos);
  m->eval();
  EXPECT_EQ(grad_fn_name(m->run_block(1, h, m->context(8))).find("CheckpointFunction"),
            std::string::npos);
  m->train();
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(m->run_block(1, h, m->context(8)).requires_grad());
}

TEST(Checkpoint, RecomputesOnceInBackwardAndPassesNonDifferentiableInputsThrough) {
  torch::manual_seed(1);
  const torch::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  const torch::Tensor x = torch::randn({3, 4}, torch::requires_grad());
  const torch::Tensor table = torch::randn({3, 4});  // like RoPE cos/sin: no gradient
  int calls = 0;
  auto fn = [&](const std::vector<torch::Tensor>& in) {
    ++calls;
    return torch::tanh(torch::matmul(in[0] * in[1], w));
  };
  const torch::Tensor y = checkpoint(fn, {x, table});
  EXPECT_EQ(calls, 1);
  y.pow(2).sum().backward();
  EXPECT_EQ(calls, 2);
  const torch::Tensor gx = x.grad().clone(), gw = w.grad().clone();
  x.mutable_grad() = torch::Tensor();
  w.mutable_grad() = torch::Tensor();
  fn({x, table}).pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(gx, x.grad(), 1e-6, 0));
  EXPECT_TRUE(torch::allclose(gw, w.grad(), 1e-6, 0));
}

TEST(Checkpoint, ParametersGetGradientsWhenNoInputRequiresGrad) {
  torch::manual_seed(2);
  const torch::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  const torch::Tensor x = torch::randn({3, 4});  // a frozen embedding's output
  const torch::Tensor y = checkpoint(
      [&](const std::vector<torch::Tensor>& in) { return torch::matmul(in[0], w); }, {x});
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(torch::allclose(w.grad(), x.sum(0).unsqueeze(1).expand({4, 4}), 1e-6, 1e-6));
}

// Dropout inside the block: the recompute must draw the mask of the forward, and the random
// stream after backward must be where it would be without checkpointing.
TEST(Checkpoint, ReplaysTheForwardsDropoutMaskAndLeavesTheRandomStreamAlone) {
  torch::manual_seed(3);
  const torch::Tensor x0 = torch::randn({64, 32});
  auto fn = [](const std::vector<torch::Tensor>& in) {
    return torch::dropout(in[0], 0.5, /*train=*/true) * in[0];
  };
  auto run = [&](bool ckpt, torch::Tensor* next_draw) {
    const torch::Tensor x = x0.clone().requires_grad_(true);
    torch::manual_seed(17);
    const torch::Tensor y = ckpt ? checkpoint(fn, {x}) : fn({x});
    torch::rand({4});  // something else draws between forward and backward
    y.sum().backward();
    *next_draw = torch::rand({4});
    return x.grad();
  };
  torch::Tensor after_plain, after_ckpt;
  const torch::Tensor plain = run(false, &after_plain);
  const torch::Tensor ckpt = run(true, &after_ckpt);
  EXPECT_TRUE(torch::equal(plain, ckpt)) << "the recompute drew a different dropout mask";
  EXPECT_TRUE(torch::equal(after_plain, after_ckpt)) << "the recompute moved the random stream";
}

TEST(CheckpointedModel, KeepsOnlyLayerInputsSoPeakMemoryDrops) {
  torch::set_num_threads(1);
  nlohmann::json doc = small_config_json();
  doc["num_hidden_layers"] = 8;
  DecoderModel m = build_model(parse_model_config(doc), torch::kFloat, 5);
  const torch::Tensor ids = random_ids(2, 256, 97, 4);
  const int64_t plain = peak_training_bytes(*m, ids);
  m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
  const int64_t ckpt = peak_training_bytes(*m, ids);
  // Saved per layer without checkpointing: a dozen [B, T, C] and [B, T, I] tensors plus, for
  // the math attention kernel, the [B, H, T, T] weights; with it, one [B, T, C] input per layer
  // plus one layer's activations while it is recomputed.
  const int64_t layer_input = 2 * 256 * 64 * 4;
  std::cout << "peak bytes during forward+backward, 8 layers, B=2 T=256: plain " << plain
            << ", checkpointed " << ckpt << "\n";
  EXPECT_LT(static_cast<double>(ckpt), 0.6 * static_cast<double>(plain));
  EXPECT_GT(plain - ckpt, 8 * 6 * layer_input) << "saved less than six layer inputs per layer";
}

}  // namespace
}  // namespace dstrain::model
