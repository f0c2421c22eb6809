// The Mixture-of-Experts MLP (model/moe.h) against a token-by-token loop written here from
// transformers' definition: routing (Qwen's and Mixtral's weights), the grouped product and the
// per-expert loop it falls back to, an expert no token chose getting an exactly zero gradient,
// checkpoint recompute picking the same experts, and the weights read from and written in the
// Hub's per-expert layout (expert_names.h). The whole model against transformers itself is the
// reference suite's (tests/reference/test_transformers.py).
#include "model/moe.h"

#include <gtest/gtest.h>

#include "model/expert_names.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "tests/unit/model/test_util.h"

namespace dstrain::model {
namespace {

using testing::small_config_json;

ModelConfig moe_config(const std::string& type, int64_t width, bool norm_topk_prob) {
  nlohmann::json doc = small_config_json(type);
  doc[type == "mixtral" ? "num_local_experts" : "num_experts"] = 4;
  doc["num_experts_per_tok"] = 2;
  if (type == "mixtral") {
    doc["intermediate_size"] = width;
  } else {
    doc["moe_intermediate_size"] = width;
    doc["norm_topk_prob"] = norm_topk_prob;
  }
  if (type == "qwen2_moe") doc["shared_expert_intermediate_size"] = 24;
  return parse_model_config(doc);
}

void randomize(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.normal_(0.0, 0.3);
}

// transformers' definition, one token at a time.
torch::Tensor loop_reference(SparseMoeImpl& moe, const ModelConfig& c, const torch::Tensor& x) {
  const torch::Tensor logits = torch::matmul(x, moe.gate->weight.t());
  const torch::Tensor probs = torch::softmax(logits.to(torch::kFloat), -1);
  auto [top, chosen] = probs.topk(c.moe.top_k, -1);
  if (c.moe.norm_topk_prob) top = top / top.sum(-1, true);
  std::vector<torch::Tensor> rows;
  const int64_t I = c.moe.expert_size;
  for (int64_t t = 0; t < x.size(0); ++t) {
    torch::Tensor sum = torch::zeros({x.size(1)});
    for (int64_t s = 0; s < c.moe.top_k; ++s) {
      const int64_t e = chosen[t][s].item<int64_t>();
      const torch::Tensor gu = torch::matmul(moe.experts->gate_up_proj[e], x[t]);
      const torch::Tensor h = torch::silu(gu.narrow(0, 0, I)) * gu.narrow(0, I, I);
      sum = sum + torch::matmul(moe.experts->down_proj[e], h) * top[t][s];
    }
    rows.push_back(sum);
  }
  torch::Tensor out = torch::stack(rows);
  if (!moe.shared_expert.is_empty()) {
    const auto& s = *moe.shared_expert;
    const torch::Tensor shared =
        torch::matmul(torch::silu(torch::matmul(x, s.gate_proj->weight.t())) *
                          torch::matmul(x, s.up_proj->weight.t()),
                      s.down_proj->weight.t());
    out = out + torch::sigmoid(torch::matmul(x, moe.shared_expert_gate->weight.t())) * shared;
  }
  return out;
}

// max|got − want| / max|want|.
double relative(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<double>() / std::max(1e-30, want.abs().max().item<double>());
}

struct Family {
  std::string type;
  int64_t width;  // 16: the grouped product; 6 (24-byte rows): the per-expert loop
  bool norm_topk_prob;
};

class SparseMoeTest : public ::testing::TestWithParam<Family> {};

TEST_P(SparseMoeTest, OutputAndGradientsEqualTheTokenLoop) {
  const Family f = GetParam();
  const ModelConfig c = moe_config(f.type, f.width, f.norm_topk_prob);
  torch::manual_seed(3);
  SparseMoe moe(c, Materialize::kYes);
  randomize(*moe);
  const torch::Tensor x = torch::randn({2, 9, c.hidden_size}, torch::requires_grad());
  const torch::Tensor got = moe(x);
  const torch::Tensor g = torch::randn_like(got);
  got.backward(g);
  std::vector<torch::Tensor> grads;
  for (auto& p : moe->parameters()) grads.push_back(p.grad().clone());
  const torch::Tensor x_grad = x.grad().clone();
  for (auto& p : moe->parameters()) p.mutable_grad() = torch::Tensor();
  x.mutable_grad() = torch::Tensor();
  const torch::Tensor want = loop_reference(*moe, c, x.reshape({-1, c.hidden_size}));
  EXPECT_LT(relative(got.reshape({-1, c.hidden_size}), want), 1e-6);
  want.backward(g.reshape({-1, c.hidden_size}));
  size_t i = 0;
  for (const auto& item : moe->named_parameters()) {
    EXPECT_LT(relative(grads[i++], item.value().grad()), 1e-6) << item.key();
  }
  EXPECT_LT(relative(x_grad, x.grad()), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Families, SparseMoeTest,
                         ::testing::Values(Family{"qwen3_moe", 16, true},
                                           Family{"qwen3_moe", 6, false},
                                           Family{"qwen2_moe", 16, false},
                                           Family{"mixtral", 16, true}, Family{"mixtral", 6, true}),
                         [](const ::testing::TestParamInfo<Family>& i) {
                           return i.param.type + "_width" + std::to_string(i.param.width);
                         });

// An expert that no token chose gets a gradient of exactly zero, on both paths.
TEST(SparseMoe, AnExpertNoTokenChoseGetsAZeroGradient) {
  for (const int64_t width : {16, 6}) {
    const ModelConfig c = moe_config("qwen3_moe", width, true);
    torch::manual_seed(4);
    SparseMoe moe(c, Materialize::kYes);
    randomize(*moe);
    {
      // Expert 3's router row far below the others: never in any token's top 2.
      torch::NoGradGuard no_grad;
      const torch::Tensor x_dir = torch::ones({c.hidden_size});
      moe->gate->weight[3].copy_(-10 * x_dir);
    }
    const torch::Tensor x = torch::rand({12, c.hidden_size}) + 0.5;
    moe(x).pow(2).sum().backward();
    EXPECT_TRUE(moe->experts->gate_up_proj.grad()[3].eq(0).all().item<bool>()) << width;
    EXPECT_TRUE(moe->experts->down_proj.grad()[3].eq(0).all().item<bool>()) << width;
    EXPECT_GT(moe->experts->down_proj.grad()[0].abs().sum().item<double>(), 0) << width;
  }
}

// A model with MoE layers: checkpoint recompute routes as the forward did (the same loss and
// gradients), and its weights written in the Hub's per-expert layout read back whole.
TEST(SparseMoe, CheckpointRecomputeAndTheHubLayout) {
  nlohmann::json doc = small_config_json("qwen3_moe");
  doc["num_experts"] = 4;
  doc["num_experts_per_tok"] = 2;
  doc["moe_intermediate_size"] = 16;
  doc["num_hidden_layers"] = 3;
  doc["mlp_only_layers"] = {1};
  const ModelConfig c = parse_model_config(doc);
  DecoderModel m = build_model(c, torch::kFloat32, 5);
  const torch::Tensor ids = torch::randint(0, c.vocab_size, {2, 12});
  const auto loss_and_grads = [&] {
    for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
    const torch::Tensor loss = m->loss_sum(ids, ids.roll(-1, 1), true).mean();
    loss.backward();
    std::vector<torch::Tensor> out = {loss.detach()};
    for (auto& p : m->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  m->train();
  const auto plain = loss_and_grads();
  m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
  const auto recomputed = loss_and_grads();
  ASSERT_EQ(plain.size(), recomputed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], recomputed[i])) << i;

  testing::TempDir dir;
  save_weights(*m, dir.path(), torch::kFloat32);
  const SafetensorsSet files(dir.path());
  EXPECT_TRUE(files.contains("model.layers.0.mlp.experts.3.up_proj.weight"));
  EXPECT_TRUE(files.contains("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(files.contains("model.layers.0.mlp.experts.gate_up_proj"));
  EXPECT_TRUE(files.contains("model.layers.1.mlp.gate_proj.weight"));  // the dense layer
  DecoderModel back(c);
  load_weights(*back, dir.path());
  for (const auto& item : m->named_parameters()) {
    EXPECT_TRUE(torch::equal(back->named_parameters()[item.key()], item.value())) << item.key();
  }
  // Expert 1's up rows are the second half of its gate_up rows.
  const torch::Tensor up = files.read("model.layers.2.mlp.experts.1.up_proj.weight");
  EXPECT_TRUE(torch::equal(
      up, m->named_parameters()["model.layers.2.mlp.experts.gate_up_proj"][1].narrow(0, 16, 16)));
  // The stacks under transformers 5's own names read as they are.
  testing::TempDir stacked;
  NamedTensors tensors;
  for (const auto& item : m->named_parameters()) tensors.emplace_back(item.key(), item.value());
  write_safetensors(stacked.path() / "model.safetensors", tensors);
  DecoderModel again(c);
  load_weights(*again, stacked.path());
  for (const auto& item : m->named_parameters()) {
    EXPECT_TRUE(torch::equal(again->named_parameters()[item.key()], item.value())) << item.key();
  }
}

// Mixtral's Hub names: block_sparse_moe, w1 (gate), w3 (up), w2 (down).
TEST(SparseMoe, MixtralsHubNames) {
  const ModelConfig c = moe_config("mixtral", 16, true);
  const auto pieces =
      hub_pieces(c, "model.layers.0.mlp.experts.gate_up_proj", {4, 32, c.hidden_size});
  ASSERT_EQ(pieces.size(), 8u);
  EXPECT_EQ(pieces[0].name, "model.layers.0.block_sparse_moe.experts.0.w1.weight");
  EXPECT_EQ(pieces[1].name, "model.layers.0.block_sparse_moe.experts.0.w3.weight");
  EXPECT_EQ(pieces[1].offset, 16 * c.hidden_size);
  EXPECT_EQ(hub_pieces(c, "model.layers.0.mlp.experts.down_proj", {4, c.hidden_size, 16})[2].name,
            "model.layers.0.block_sparse_moe.experts.2.w2.weight");
  EXPECT_EQ(hub_pieces(c, "model.layers.0.mlp.gate.weight", {4, c.hidden_size})[0].name,
            "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_TRUE(hub_pieces(c, "model.layers.0.self_attn.q_proj.weight", {64, 64}).empty());
}

}  // namespace
}  // namespace dstrain::model
