// Selective activation checkpointing on a GPU: the CUDA kernels that return the softmax statistics
// (flash for bfloat16, memory-efficient for float32) run once per layer per step, and the loss and
// gradients are those of no checkpointing: float32 within 1e-5, bfloat16 within the reference
// suite's rule against a float32 run (each tensor's error at most 4x that of bfloat16 without
// checkpointing, or 1e-2). Exits 77 (skipped) without a device.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "model/model.h"
#include "tests/unit/model/op_calls.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model {
namespace {

using testing::LossAndGrads;
using testing::OpCalls;
using testing::relative_difference;
using testing::train_pass;

constexpr int64_t kLayers = 3;

// Grouped-query attention with head_dim 64 (flash takes it).
DecoderModel cuda_model(torch::ScalarType dtype) {
  const ModelConfig c = parse_model_config({{"model_type", "llama"},
                                            {"vocab_size", 97},
                                            {"hidden_size", 256},
                                            {"intermediate_size", 512},
                                            {"num_hidden_layers", kLayers},
                                            {"num_attention_heads", 4},
                                            {"num_key_value_heads", 2},
                                            {"max_position_embeddings", 4096},
                                            {"rms_norm_eps", 1e-6},
                                            {"rope_theta", 10000.0},
                                            {"tie_word_embeddings", false}});
  DecoderModel m = build_model(c, dtype, 3);
  m->to(torch::Device(torch::kCUDA, 0));
  return m;
}

torch::Tensor cuda_ids() {
  torch::manual_seed(5);
  return torch::randint(0, 97, {2, 512}, torch::kLong).to(torch::kCUDA);
}

// One training pass, and the SDPA kernel calls it made (forward, backward).
LossAndGrads pass(torch::ScalarType dtype, bool selective, std::pair<int, int>* kernels) {
  DecoderModel m = cuda_model(dtype);
  if (selective) m->wrap_blocks(WrapperSlot::kCheckpointing, selective_checkpoint_layers());
  const OpCalls calls;
  LossAndGrads out = train_pass(*m, cuda_ids());
  torch::cuda::synchronize();
  if (kernels) {
    *kernels = {calls.count_prefix("aten::_scaled_dot_product_", false),
                calls.count_prefix("aten::_scaled_dot_product_", true)};
  }
  return out;
}

TEST(SelectiveCheckpointGpu, Float32EqualsNoCheckpointingWithOneAttentionPerLayer) {
  std::pair<int, int> kernels;
  const LossAndGrads none = pass(torch::kFloat, false, nullptr);
  const LossAndGrads selective = pass(torch::kFloat, true, &kernels);
  EXPECT_EQ(kernels, std::make_pair(int(kLayers), int(kLayers)));
  testing::expect_same_training(none, selective, 1e-5);
}

TEST(SelectiveCheckpointGpu, Bfloat16WithinTheReferenceRule) {
  std::pair<int, int> kernels;
  const LossAndGrads exact = pass(torch::kFloat, false, nullptr);
  const LossAndGrads none = pass(torch::kBFloat16, false, nullptr);
  const LossAndGrads selective = pass(torch::kBFloat16, true, &kernels);
  EXPECT_EQ(kernels, std::make_pair(int(kLayers), int(kLayers)));
  ASSERT_EQ(exact.grads.size(), selective.grads.size());
  for (size_t i = 0; i < exact.grads.size(); ++i) {
    const auto& [name, want] = exact.grads[i];
    const double base = relative_difference(want, none.grads[i].second);
    const double got = relative_difference(want, selective.grads[i].second);
    EXPECT_LE(got, std::max(4 * base, 1e-2)) << name << ": bf16 without checkpointing " << base;
  }
}

}  // namespace
}  // namespace dstrain::model
