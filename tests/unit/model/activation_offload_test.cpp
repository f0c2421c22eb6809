// Activation-checkpoint offload on the CPU: the same loss and gradients as plain checkpointing,
// and the checkpointed layers' inputs held by the offload store (not the autograd graph) from
// their forward until their backward. On the CPU the store keeps the tensors themselves; the
// pinned-memory and side-stream path is tested on a GPU (tests/gpu/activation_offload_gpu_test).
#include "model/activation_offload.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "model/activation_checkpoint.h"
#include "model/model.h"
#include "test_util.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model {
namespace {

using testing::random_ids;
using testing::small_config_json;
using testing::take_grads;

TEST(ActivationOffload, CheckpointingWithOffloadGivesTheSameLossAndGradients) {
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    nlohmann::json doc = small_config_json();
    doc["num_hidden_layers"] = 3;
    DecoderModel m = build_model(parse_model_config(doc), dtype, 3);
    m->train();
    m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
    const torch::Tensor ids = random_ids(2, 24, 97, 9);
    const torch::Tensor plain_loss = causal_lm_loss(m->forward(ids), ids.roll(-1, 1));
    plain_loss.backward();
    const std::vector<torch::Tensor> plain = take_grads(*m);
    m->unwrap_blocks();
    m->wrap_blocks(WrapperSlot::kCheckpointing,
                   checkpoint_layers(std::make_shared<ActivationOffload>()));
    const torch::Tensor loss = causal_lm_loss(m->forward(ids), ids.roll(-1, 1));
    loss.backward();
    const std::vector<torch::Tensor> offloaded = take_grads(*m);
    EXPECT_TRUE(torch::equal(plain_loss, loss));
    ASSERT_EQ(plain.size(), offloaded.size());
    for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], offloaded[i]));
  }
}

// The store's accounting: one entry per layer after the forward, each the layer's input (on the
// CPU, the very tensor), none left once the backward has used them.
TEST(ActivationOffload, LayerInputsLiveInTheStoreFromForwardUntilTheirBackward) {
  nlohmann::json doc = small_config_json();
  doc["num_hidden_layers"] = 4;
  DecoderModel m = build_model(parse_model_config(doc), torch::kFloat, 4);
  m->train();
  auto offload = std::make_shared<ActivationOffload>();
  m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers(offload));
  std::vector<torch::Tensor> inputs;
  m->wrap_blocks(WrapperSlot::kEngine, [&](const ModelBlock& b, const torch::Tensor& x,
                                           const BlockContext&, const BlockFn& run) {
    if (b.role == BlockRole::kLayer) inputs.push_back(x);
    return run(x);
  });
  const int64_t B = 2, T = 16, C = 64;
  const torch::Tensor ids = random_ids(B, T, 97, 5);
  const ActivationOffload& store = *offload;
  torch::Tensor loss = causal_lm_loss(m->forward(ids), ids.roll(-1, 1));
  EXPECT_EQ(store.live_entries(), 4);
  EXPECT_EQ(store.live_host_bytes(), 4 * B * T * C * 4);
  const std::vector<torch::Tensor> held = store.host_tensors();
  ASSERT_EQ(held.size(), inputs.size());
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_EQ(held[i].data_ptr(), inputs[i].data_ptr())
        << "entry " << i << " is not layer " << i << "'s input";
  }
  inputs.clear();  // the test's own references
  loss.backward();
  EXPECT_EQ(store.live_entries(), 0) << "inputs outlived their layer's backward";
  EXPECT_EQ(store.live_host_bytes(), 0);
  EXPECT_EQ(store.total_stored(), 4);
}

TEST(ActivationOffload, EvalAndNoGradRunsStoreNothing) {
  DecoderModel m = build_model(testing::small_config(), torch::kFloat, 4);
  auto offload = std::make_shared<ActivationOffload>();
  m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers(offload));
  const torch::Tensor ids = random_ids(1, 8, 97, 6);
  m->eval();
  (void)m->forward(ids);
  m->train();
  {
    torch::NoGradGuard no_grad;
    (void)m->forward(ids);
  }
  EXPECT_EQ(offload->total_stored(), 0);
}

// Only the marked inputs go to the store; the others are saved in the graph as usual.
TEST(ActivationOffload, CheckpointStoresOnlyTheMarkedInputs) {
  torch::manual_seed(1);
  auto store = std::make_shared<ActivationOffload>();
  const torch::Tensor x = torch::randn({3, 4}, torch::requires_grad());
  const torch::Tensor table = torch::randn({3, 4});
  const torch::Tensor w = torch::randn({4, 4}, torch::requires_grad());
  auto fn = [&](const std::vector<torch::Tensor>& in) {
    return torch::tanh(torch::matmul(in[0] * in[1], w));
  };
  const torch::Tensor y = checkpoint(fn, {x, table}, CheckpointOffload{store, {true, false}});
  EXPECT_EQ(store->live_entries(), 1);
  EXPECT_EQ(store->live_host_bytes(), 3 * 4 * 4);
  y.pow(2).sum().backward();
  EXPECT_EQ(store->live_entries(), 0);
  const torch::Tensor gx = x.grad().clone(), gw = w.grad().clone();
  x.mutable_grad() = torch::Tensor();
  w.mutable_grad() = torch::Tensor();
  fn({x, table}).pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(gx, x.grad(), 1e-6, 0));
  EXPECT_TRUE(torch::allclose(gw, w.grad(), 1e-6, 0));
}

}  // namespace
}  // namespace dstrain::model
