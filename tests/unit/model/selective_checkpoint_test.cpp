// Selective activation checkpointing: the loss and every gradient of no checkpointing and of plain
// checkpointing, with attention run once per layer per step (its recompute takes the forward's
// output), counted at the ATen operators the CPU runs; sliding-window layers beyond their window
// fall back to recomputing attention and still train the same.
#include "model/selective_attention.h"

#include <gtest/gtest.h>

#include "model/model.h"
#include "test_util.h"
#include "tests/unit/model/op_calls.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model {
namespace {

using testing::expect_same_training;
using testing::LossAndGrads;
using testing::OpCalls;
using testing::random_ids;
using testing::small_config_json;
using testing::train_pass;

constexpr const char* kFlashForward = "aten::_scaled_dot_product_flash_attention_for_cpu";
constexpr const char* kFlashBackward = "aten::_scaled_dot_product_flash_attention_for_cpu_backward";

struct SelectiveCase {
  const char* name;
  nlohmann::json overrides;
  torch::ScalarType dtype;
};

DecoderModel model_for(const SelectiveCase& c) {
  nlohmann::json doc = small_config_json(c.overrides.value("model_type", "llama"));
  doc["num_hidden_layers"] = 3;
  for (const auto& [key, value] : c.overrides.items()) doc[key] = value;
  return build_model(parse_model_config(doc), c.dtype, 3);
}

class SelectiveCheckpointedModel : public ::testing::TestWithParam<SelectiveCase> {};

// The same kernels run forward and backward in all three (flash for CPU, its own backward from the
// same output and statistics), so the results are equal bit for bit, in bfloat16 too.
TEST_P(SelectiveCheckpointedModel, GivesTheLossAndGradientsOfNoCheckpointingAndOfTrue) {
  const torch::Tensor ids = random_ids(2, 24, 97, 9);
  DecoderModel m = model_for(GetParam());
  const LossAndGrads none = train_pass(*m, ids);
  m = model_for(GetParam());
  m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
  const LossAndGrads plain = train_pass(*m, ids);
  m = model_for(GetParam());
  m->wrap_blocks(WrapperSlot::kCheckpointing, selective_checkpoint_layers());
  const LossAndGrads selective = train_pass(*m, ids);
  expect_same_training(none, selective, 0.0);
  expect_same_training(plain, selective, 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, SelectiveCheckpointedModel,
    ::testing::Values(
        SelectiveCase{"gqa_fp32", nlohmann::json::object(), torch::kFloat},
        SelectiveCase{"gqa_bf16", nlohmann::json::object(), torch::kBFloat16},
        SelectiveCase{"mha_fp32", {{"num_key_value_heads", 4}}, torch::kFloat},
        SelectiveCase{"qwen3_fp32", {{"model_type", "qwen3"}, {"head_dim", 16}}, torch::kFloat},
        SelectiveCase{
            "window_fits_fp32", {{"model_type", "mistral"}, {"sliding_window", 32}}, torch::kFloat},
        SelectiveCase{"window_shorter_fp32",
                      {{"model_type", "mistral"}, {"sliding_window", 8}},
                      torch::kFloat}),
    [](const auto& info) { return std::string(info.param.name); });

// Tiled MLP inside the layer (its own recompute per tile, tiled_mlp.h) beside the kept attention.
TEST(SelectiveCheckpointedModel, WithTiledMlpGivesTheGradientsOfNoCheckpointing) {
  const torch::Tensor ids = random_ids(2, 24, 97, 9);
  const SelectiveCase c{"gqa", nlohmann::json::object(), torch::kFloat};
  DecoderModel m = model_for(c);
  m->set_tiled_mlp(8);
  const LossAndGrads none = train_pass(*m, ids);
  m = model_for(c);
  m->set_tiled_mlp(8);
  m->wrap_blocks(WrapperSlot::kCheckpointing, selective_checkpoint_layers());
  expect_same_training(none, train_pass(*m, ids), 0.0);
}

// Attention kernels per forward + backward of a 3-layer model: without checkpointing 3 forward
// calls, with plain checkpointing 6 (the recompute runs them again), selective 3 (the recompute
// takes the kept output); 3 backward calls in every case.
TEST(SelectiveCheckpointedModel, RunsAttentionOncePerLayerAndStep) {
  const torch::Tensor ids = random_ids(2, 24, 97, 9);
  auto count = [&](const BlockWrapper& wrapper) {
    DecoderModel m = model_for({"gqa", nlohmann::json::object(), torch::kFloat});
    if (wrapper) m->wrap_blocks(WrapperSlot::kCheckpointing, wrapper);
    const OpCalls calls;
    (void)train_pass(*m, ids);
    return std::make_pair(calls.count(kFlashForward), calls.count(kFlashBackward));
  };
  EXPECT_EQ(count(nullptr), std::make_pair(3, 3));
  EXPECT_EQ(count(checkpoint_layers()), std::make_pair(6, 3));
  EXPECT_EQ(count(selective_checkpoint_layers()), std::make_pair(3, 3));
}

// A window shorter than the sequence: those layers recompute their attention (the band kernel
// keeps no statistics) as plain checkpointing does; a window the sequence fits in keeps it.
TEST(SelectiveCheckpointedModel, RecomputesAttentionOnlyOfWindowsShorterThanTheSequence) {
  const torch::Tensor ids = random_ids(2, 24, 97, 9);
  auto forward_calls = [&](int64_t window, const BlockWrapper& wrapper) {
    DecoderModel m = model_for(
        {"window", {{"model_type", "mistral"}, {"sliding_window", window}}, torch::kFloat});
    m->wrap_blocks(WrapperSlot::kCheckpointing, wrapper);
    const OpCalls calls;
    (void)train_pass(*m, ids);
    return calls.count(kFlashForward);
  };
  EXPECT_EQ(forward_calls(8, selective_checkpoint_layers()), forward_calls(8, checkpoint_layers()));
  EXPECT_EQ(forward_calls(32, selective_checkpoint_layers()), 3);
  EXPECT_EQ(forward_calls(32, checkpoint_layers()), 6);
}

// The keep: entries in order, one take per entry, an empty keep is an internal error.
TEST(AttentionKeep, HandsEachEntryOutOnceInOrder) {
  AttentionKeep keep;
  KeptAttention a, b;
  a.out = torch::zeros({1});
  b.out = torch::ones({1});
  keep.push(a);
  keep.push(b);
  EXPECT_EQ(keep.take().out.item<float>(), 0.0f);
  EXPECT_EQ(keep.take().out.item<float>(), 1.0f);
  EXPECT_EQ(keep.size(), 0u);
  testing::expect_error([&] { keep.take(); }, ErrorKind::kInternal, {"one backward per forward"});
}

// Outside a scope, or for a window shorter than the sequence, nothing is kept.
TEST(AttentionKeep, IsActiveOnlyInsideAScopeAndForWholeSequenceAttention) {
  const torch::Tensor q = torch::zeros({1, 2, 16, 8});
  EXPECT_EQ(attention_keep(q, std::nullopt), nullptr);
  AttentionKeep keep;
  {
    const KeepAttentionScope scope(keep);
    EXPECT_EQ(attention_keep(q, std::nullopt), &keep);
    EXPECT_EQ(attention_keep(q, 16), &keep);
    EXPECT_EQ(attention_keep(q, 15), nullptr);
  }
  EXPECT_EQ(attention_keep(q, std::nullopt), nullptr);
}

}  // namespace
}  // namespace dstrain::model
