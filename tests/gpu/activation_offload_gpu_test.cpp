// Activation-checkpoint offload on a GPU: the checkpointed layer inputs are copied to pinned host
// memory on a side stream and back before the recompute; losses and gradients equal plain
// checkpointing, the host copies hold the inputs' values, and the device's peak memory drops by
// about the layer inputs it no longer holds. Exits 77 (skipped) without a device.
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "model/activation_offload.h"
#include "model/model.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model {
namespace {

using testing::take_grads;

ModelConfig config(int64_t layers, int64_t intermediate) {
  return parse_model_config({{"model_type", "llama"},
                             {"vocab_size", 97},
                             {"hidden_size", 256},
                             {"intermediate_size", intermediate},
                             {"num_hidden_layers", layers},
                             {"num_attention_heads", 4},
                             {"num_key_value_heads", 2},
                             {"max_position_embeddings", 8192},
                             {"rms_norm_eps", 1e-6},
                             {"rope_theta", 10000.0},
                             {"tie_word_embeddings", false}});
}

DecoderModel cuda_model(int64_t layers, int64_t intermediate) {
  DecoderModel m = build_model(config(layers, intermediate), torch::kFloat, 3);
  m->to(torch::Device(torch::kCUDA, 0));
  m->train();
  m->set_gradient_checkpointing(true);
  return m;
}

torch::Tensor cuda_ids(int64_t B, int64_t T) {
  torch::manual_seed(5);
  return torch::randint(0, 97, {B, T}, torch::kLong).to(torch::kCUDA);
}

TEST(ActivationOffloadGpu, SameLossAndGradientsAndPinnedCopiesOfTheLayerInputs) {
  DecoderModel m = cuda_model(4, 512);
  const torch::Tensor ids = cuda_ids(2, 256);
  const torch::Tensor plain_loss = causal_lm_loss(m->forward(ids), ids.roll(-1, 1));
  plain_loss.backward();
  const auto plain = take_grads(*m);

  m->set_activation_offload(true);
  std::vector<torch::Tensor> inputs;
  m->set_layer_hooks(
      {[&](int64_t, const torch::Tensor& h) { inputs.push_back(h.detach()); }, nullptr});
  const torch::Tensor loss = causal_lm_loss(m->forward(ids), ids.roll(-1, 1));
  const ActivationOffload& store = *m->activation_offload();
  ASSERT_EQ(store.live_entries(), 4);
  torch::cuda::synchronize();
  const auto held = store.host_tensors();
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_TRUE(held[i].is_cpu() && held[i].is_pinned()) << "entry " << i;
    EXPECT_TRUE(torch::equal(held[i], inputs[i].cpu())) << "entry " << i;
  }
  inputs.clear();
  loss.backward();
  EXPECT_EQ(store.live_entries(), 0);
  const auto offloaded = take_grads(*m);
  EXPECT_TRUE(torch::equal(plain_loss, loss));
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], offloaded[i])) << i;
}

int64_t peak_allocated(DecoderModelImpl& m, const torch::Tensor& ids) {
  torch::cuda::synchronize();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  const auto before = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  const int64_t start = before.allocated_bytes[0].current;
  causal_lm_loss(m.forward(ids), ids.roll(-1, 1)).backward();
  torch::cuda::synchronize();
  const auto after = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
  for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
  return after.allocated_bytes[0].peak - start;
}

TEST(ActivationOffloadGpu, PeakDeviceMemoryDropsByTheLayerInputs) {
  const int64_t L = 16, B = 1, T = 4096, C = 256;
  DecoderModel m = cuda_model(L, 256);
  const torch::Tensor ids = cuda_ids(B, T);
  (void)peak_allocated(*m, ids);  // warm-up
  const int64_t plain = peak_allocated(*m, ids);
  m->set_activation_offload(true);
  (void)peak_allocated(*m, ids);
  const int64_t offloaded = peak_allocated(*m, ids);
  const int64_t input = B * T * C * 4;
  std::cout << "peak device bytes, " << L << " layers, T=" << T << ": checkpointing " << plain
            << ", with offload " << offloaded << " (one layer input: " << input << ")\n";
  EXPECT_GT(plain - offloaded, (L - 4) * input);
}

}  // namespace
}  // namespace dstrain::model
