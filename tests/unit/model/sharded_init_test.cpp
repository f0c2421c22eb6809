// Building a model whose parameters hold no memory, and initialising any slice of a parameter to
// exactly the values a full initialisation gives it.
#include <gtest/gtest.h>

#include "model/model.h"
#include "model/storage.h"
#include "test_util.h"

namespace dstrain::model {
namespace {

using testing::small_config;
using testing::small_config_json;

// Large enough that the embedding spans several init blocks of 65536 elements.
ModelConfig wide_config() {
  auto j = small_config_json();
  j["vocab_size"] = 1500;
  j["hidden_size"] = 128;
  j["pad_token_id"] = 7;
  return parse_model_config(j);
}

TEST(ShardedInit, AnyRangeEqualsTheSameSliceOfTheFullInit) {
  const ModelConfig c = wide_config();
  DecoderModel full = build_model(c, torch::kFloat, 11);
  const auto params = full->named_parameters();
  const torch::Tensor embed = params["model.embed_tokens.weight"].reshape({-1});
  ASSERT_GT(embed.numel(), 2 * 65536);
  // Ranges inside a block, across one and two block boundaries, at both ends, and empty.
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 10}, {100, 65600}, {65530, 131080}, {embed.numel() - 5, embed.numel()}, {900, 900}};
  for (const auto& [b, e] : ranges) {
    const torch::Tensor got =
        init_values(c, "model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, 11, b, e);
    EXPECT_TRUE(torch::equal(got, embed.narrow(0, b, e - b))) << "[" << b << ", " << e << ")";
  }
  // Every parameter, cut into three uneven pieces.
  for (const auto& item : params) {
    const torch::Tensor flat = item.value().reshape({-1});
    const int64_t n = flat.numel(), a = n / 3, b = n / 3 + n / 5;
    torch::Tensor joined = torch::cat({init_values(c, item.key(), item.value().sizes(), 11, 0, a),
                                       init_values(c, item.key(), item.value().sizes(), 11, a, b),
                                       init_values(c, item.key(), item.value().sizes(), 11, b, n)});
    EXPECT_TRUE(torch::equal(joined, flat)) << item.key();
  }
}

TEST(ShardedInit, PadRowIsZeroNormsOneAndSeedsDiffer) {
  const ModelConfig c = wide_config();
  const torch::Tensor row =
      init_values(c, "model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, 3,
                  7 * c.hidden_size - 4, 8 * c.hidden_size + 4);
  EXPECT_TRUE(torch::equal(row.narrow(0, 4, c.hidden_size), torch::zeros({c.hidden_size})));
  EXPECT_NE(row[0].item<float>(), 0.0f);
  EXPECT_TRUE(torch::equal(init_values(c, "model.norm.weight", {c.hidden_size}, 3, 0, 5),
                           torch::ones({5})));
  const auto w = [&](uint64_t seed, const std::string& name) {
    return init_values(c, name, {c.hidden_size, c.hidden_size}, seed, 0, 64);
  };
  EXPECT_FALSE(torch::equal(w(3, "model.layers.0.self_attn.q_proj.weight"),
                            w(4, "model.layers.0.self_attn.q_proj.weight")));
  EXPECT_FALSE(torch::equal(w(3, "model.layers.0.self_attn.q_proj.weight"),
                            w(3, "model.layers.1.self_attn.q_proj.weight")));
  const torch::Tensor v = w(3, "model.layers.0.mlp.up_proj.weight");
  EXPECT_NEAR(v.std().item<double>(), c.initializer_range, c.initializer_range * 0.35);
  EXPECT_THROW(init_values(c, "model.norm.weight", {c.hidden_size}, 3, 0, c.hidden_size + 1),
               Error);
}

TEST(ShardedInit, UnmaterializedModelHasTheNamesAndShapesButNoMemory) {
  for (const bool tied : {false, true}) {
    auto j = small_config_json("qwen3");
    j["tie_word_embeddings"] = tied;
    j["head_dim"] = 16;
    const ModelConfig c = parse_model_config(j);
    DecoderModel full(c);
    DecoderModel empty(c, Materialize::kNo);
    const auto a = full->named_parameters();
    const auto b = empty->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].key(), b[i].key());
      EXPECT_EQ(a[i].value().sizes(), b[i].value().sizes()) << a[i].key();
      EXPECT_TRUE(b[i].value().requires_grad()) << a[i].key();
      EXPECT_EQ(storage_bytes(b[i].value()), 0) << a[i].key();
      EXPECT_GT(storage_bytes(a[i].value()), 0) << a[i].key();
    }
  }
}

}  // namespace
}  // namespace dstrain::model
