// Tiled MLP: the same loss and gradients as the untiled model for tile sizes that do and do not
// divide the token count (with and without activation checkpointing, with adapters on the MLP
// projections, in bf16), each parameter's gradient delivered once per backward, the forward's
// dropout masks replayed, and a measured drop in peak memory.
#include "model/tiled_mlp.h"

#include <algorithm>
#include <iostream>

#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "model/model.h"
#include "test_util.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model {
namespace {

using testing::expect_same_training;
using testing::LossAndGrads;
using testing::peak_training_bytes;
using testing::random_ids;
using testing::relative_difference;
using testing::small_config_json;
using testing::train_pass;

TEST(TiledMlp, TileTokensFollowTheSetting) {
  EXPECT_EQ(mlp_tile_tokens(kTiledMlpOff, 100000, 64), 0);
  // auto: ceil(tokens / hidden) equal tiles; one tile means untiled.
  EXPECT_EQ(mlp_tile_tokens(kTiledMlpAuto, 64, 64), 0);
  EXPECT_EQ(mlp_tile_tokens(kTiledMlpAuto, 65, 64), 33);
  EXPECT_EQ(mlp_tile_tokens(kTiledMlpAuto, 8192, 1024), 1024);
  EXPECT_EQ(mlp_tile_tokens(kTiledMlpAuto, 8193, 1024), 911);  // 9 tiles
  EXPECT_EQ(mlp_tile_tokens(100, 1000, 64), 100);
  EXPECT_EQ(mlp_tile_tokens(1000, 1000, 64), 0);
  EXPECT_EQ(mlp_tile_tokens(5000, 1000, 64), 0);
}

struct Case {
  int64_t tile;       // tokens per tile (B·T = 48 tokens)
  bool checkpointed;  // activation checkpointing too
};

class TiledModel : public ::testing::TestWithParam<Case> {};

TEST_P(TiledModel, GivesTheSameLossAndEveryParameterGradient) {
  nlohmann::json doc = small_config_json();
  doc["num_hidden_layers"] = 2;
  DecoderModel m = build_model(parse_model_config(doc), torch::kFloat, 3);
  const torch::Tensor ids = random_ids(2, 24, 97, 9);
  if (GetParam().checkpointed) m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
  const LossAndGrads plain = train_pass(*m, ids);
  m->set_tiled_mlp(GetParam().tile);
  const LossAndGrads tiled = train_pass(*m, ids);
  expect_same_training(plain, tiled, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Tiles, TiledModel,
                         ::testing::Values(Case{1, false}, Case{7, false}, Case{16, false},
                                           Case{47, false}, Case{7, true}, Case{16, true}),
                         [](const auto& info) {
                           return "tile" + std::to_string(info.param.tile) +
                                  (info.param.checkpointed ? "_checkpointed" : "");
                         });

TEST(TiledModel, AutoTilesLongSequencesAndMatchesUntiledInBf16) {
  DecoderModel m = build_model(testing::small_config(), torch::kBFloat16, 4);
  const torch::Tensor ids = random_ids(1, 100, 97, 2);  // 100 tokens, hidden 64: 2 tiles of 50
  const LossAndGrads plain = train_pass(*m, ids);
  m->set_tiled_mlp(kTiledMlpAuto);
  const LossAndGrads tiled = train_pass(*m, ids);
  // bf16 matrix products over other row blocks round differently; the tiled gradients are summed
  // in float32, so they are no further from the truth than the untiled ones.
  expect_same_training(plain, tiled, 2e-2);
}

// A LoRA-like adapter, x·Aᵀ·Bᵀ, on every MLP projection.
class TestAdapter : public LinearAdapter {
 public:
  TestAdapter(int64_t in, int64_t out)
      : A(torch::randn({4, in}).mul_(0.1).requires_grad_()),
        B(torch::randn({out, 4}).mul_(0.1).requires_grad_()) {}
  torch::Tensor delta(const torch::Tensor& x, bool) override {
    namespace F = torch::nn::functional;
    return F::linear(F::linear(x, A), B);
  }
  std::vector<torch::Tensor> parameters() const override { return {A, B}; }
  torch::Tensor A, B;
};

TEST(TiledModel, AdaptersOnTheMlpProjectionsGetTheirGradients) {
  DecoderModel m = build_model(testing::small_config(), torch::kFloat, 5);
  torch::manual_seed(6);
  std::vector<torch::Tensor> adapter_params;
  for (int64_t i = 0; i < m->num_layers(); ++i) {
    Mlp mlp = m->decoder_layer(i)->mlp;
    for (Linear projection : {mlp->gate_proj, mlp->up_proj, mlp->down_proj}) {
      auto adapter =
          std::make_shared<TestAdapter>(projection->in_features, projection->out_features);
      adapter_params.push_back(adapter->A);
      adapter_params.push_back(adapter->B);
      projection->adapter = adapter;
    }
  }
  for (auto& p : m->parameters()) p.requires_grad_(false);  // a frozen base, as under LoRA
  const torch::Tensor ids = random_ids(2, 20, 97, 7);
  const LossAndGrads plain = train_pass(*m, ids, adapter_params);
  m->set_tiled_mlp(6);
  const LossAndGrads tiled = train_pass(*m, ids, adapter_params);
  ASSERT_EQ(plain.grads.size(), tiled.grads.size());
  for (size_t i = 0; i < plain.grads.size(); ++i) {
    const auto& [name, g] = plain.grads[i];
    ASSERT_EQ(g.defined(), tiled.grads[i].second.defined()) << name;
    if (g.defined()) {
      EXPECT_LE(relative_difference(g, tiled.grads[i].second), 1e-5) << name;
    }
  }
  EXPECT_TRUE(plain.grads.back().second.defined()) << "the adapters got no gradient";
}

// Counts the runs of a gradient accumulator: what the ZeRO engines hook (zero/grad_hooks.h).
class CountingPostHook : public torch::autograd::FunctionPostHook {
 public:
  explicit CountingPostHook(int* count) : count_(count) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ++*count_;
    return outputs;
  }

 private:
  int* count_;
};

// Engines count a parameter's gradient as ready when autograd has accumulated it: that must
// happen once per backward, not once per tile. (A tensor hook registered on the parameter itself
// does see each tile's part: torch::autograd::grad runs those for the tensors it differentiates.)
TEST(TiledMlp, EachParameterGradientIsAccumulatedOncePerBackward) {
  torch::manual_seed(8);
  const torch::Tensor w = torch::randn({8, 5}, torch::requires_grad());
  const torch::Tensor x = torch::randn({23, 5}, torch::requires_grad());
  int arrivals = 0;
  const auto accumulator = torch::autograd::impl::grad_accumulator(w);
  accumulator->add_post_hook(std::make_unique<CountingPostHook>(&arrivals));
  auto fn = [&](const torch::Tensor& rows) { return torch::tanh(torch::matmul(rows, w.t())); };
  const torch::Tensor y = tiled_tokenwise(fn, x, 4, {w});  // 6 tiles
  y.pow(2).sum().backward();
  EXPECT_EQ(arrivals, 1);
  const torch::Tensor gw = w.grad().clone(), gx = x.grad().clone();
  w.mutable_grad() = torch::Tensor();
  x.mutable_grad() = torch::Tensor();
  fn(x).pow(2).sum().backward();
  EXPECT_LE(relative_difference(w.grad(), gw), 1e-6);
  EXPECT_LE(relative_difference(x.grad(), gx), 1e-6);
}

// Dropout inside a tile: the recompute must draw the forward's masks. With y = dropout(x)·w, the
// gradient of Σ y·g with respect to w is Σ (y / w)·g only if backward saw the forward's mask.
TEST(TiledMlp, ReplaysTheForwardsDropoutMasks) {
  torch::manual_seed(9);
  const torch::Tensor w = (torch::rand({6}) + 0.5).requires_grad_();
  const torch::Tensor x = torch::randn({40, 6});
  const torch::Tensor g = torch::randn({40, 6});
  const torch::Tensor y = tiled_tokenwise(
      [&](const torch::Tensor& rows) { return torch::dropout(rows, 0.5, true) * w; }, x, 7, {w});
  torch::rand({3});  // something else draws between forward and backward
  (y * g).sum().backward();
  const torch::Tensor expected = (y.detach() / w.detach() * g).sum(0);
  EXPECT_LE(relative_difference(w.grad(), expected), 1e-6);
}

// With checkpointing, a layer's recompute holds its MLP intermediates (about six [T, I] tensors);
// tiled, one tile's. A wide MLP (I = 8·C) makes them the largest activations of the layer.
TEST(TiledModel, PeakMemoryDropsByTheMlpIntermediates) {
  torch::set_num_threads(1);
  nlohmann::json doc = small_config_json();
  doc["intermediate_size"] = 512;
  doc["num_hidden_layers"] = 2;
  doc["max_position_embeddings"] = 2048;
  DecoderModel m = build_model(parse_model_config(doc), torch::kFloat, 5);
  m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
  const int64_t T = 1024, I = 512;
  const torch::Tensor ids = random_ids(1, T, 97, 4);
  const int64_t plain = peak_training_bytes(*m, ids);
  m->set_tiled_mlp(kTiledMlpAuto);  // 16 tiles of 64 tokens
  const int64_t tiled = peak_training_bytes(*m, ids);
  const int64_t intermediate = T * I * 4;  // one [T, I] float32 tensor
  std::cout << "peak bytes during forward+backward, T=" << T << " C=64 I=" << I << ": untiled "
            << plain << ", tiled " << tiled << " ([T, I] = " << intermediate << ")\n";
  EXPECT_GT(plain - tiled, 3 * intermediate) << "tiling saved less than three [T, I] tensors";
}

}  // namespace
}  // namespace dstrain::model
