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

  // With the router's losses: their gradient reaches the recomputed layers' routers as it reaches
  // the kept ones.
  const torch::Tensor lm_only = m->named_parameters()["model.layers.2.mlp.gate.weight"].grad();
  MoeConfig losses = c.moe;
  losses.aux_loss = true;
  losses.z_loss_coef = 1e-3;
  DecoderModel r = build_model(
      [&] {
        ModelConfig with = c;
        with.moe = losses;
        return with;
      }(),
      torch::kFloat32, 5);
  r->train();
  const auto router_grads = [&] {
    for (auto& p : r->parameters()) p.mutable_grad() = torch::Tensor();
    const LossSum ls = r->loss_sum(ids, ids.roll(-1, 1), true);
    EXPECT_TRUE(ls.router.defined());
    (ls.mean() + router_losses(ls.router).weighted(losses)).backward();
    return r->named_parameters()["model.layers.2.mlp.gate.weight"].grad().clone();
  };
  const torch::Tensor kept = router_grads();
  r->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
  EXPECT_TRUE(torch::equal(kept, router_grads()));
  EXPECT_GT(relative(kept, lm_only), 1e-3);  // the losses do move it

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

// transformers' load_balancing_loss_func over the layers' router logits [N, E] (each layer's
// rows the same tokens), `keep` [N] its attention mask (1: a token, 0: padding), and ST-MoE's
// z-loss over the same tokens.
std::pair<torch::Tensor, torch::Tensor> reference_router_losses(
    const std::vector<torch::Tensor>& logits, const torch::Tensor& keep, int64_t top_k) {
  const int64_t E = logits[0].size(1);
  torch::Tensor counts = torch::zeros({E}), probs = torch::zeros({E}), z = torch::zeros({});
  torch::Tensor rows = torch::zeros({});
  for (const torch::Tensor& l : logits) {
    const torch::Tensor p = torch::softmax(l, -1);
    const torch::Tensor chosen = std::get<1>(p.topk(top_k, -1));
    counts = counts + torch::one_hot(chosen, E)
                          .to(torch::kFloat)
                          .mul(keep.view({-1, 1, 1}))
                          .sum(std::vector<int64_t>{0, 1});
    probs = probs + (p * keep.unsqueeze(-1)).sum(0);
    z = z + (torch::logsumexp(l, -1).square() * keep).sum();
    rows = rows + keep.sum();
  }
  return {(counts / rows * (probs / rows)).sum() * static_cast<double>(E), z / rows};
}

// The router's losses pooled over two layers, with padding left out, against the reference: the
// values, and the routers' gradients, which reach each layer through its output's node (moe.h).
TEST(RouterLosses, PooledOverTheLayersAsTransformersComputesThem) {
  ModelConfig c = moe_config("qwen3_moe", 16, true);
  c.moe.aux_loss = true;
  c.moe.aux_loss_coef = 0.5;
  c.moe.z_loss_coef = 0.25;
  torch::manual_seed(3);
  SparseMoe first(c, Materialize::kYes, 0), second(c, Materialize::kYes, 1);
  randomize(*first);
  randomize(*second);
  const torch::Tensor x = torch::randn({2, 5, c.hidden_size});
  torch::Tensor real = torch::ones({2, 5}, torch::kBool);
  real[1].narrow(0, 3, 2).fill_(false);  // the second row's last two tokens are padding

  const auto record = c10::make_intrusive<RouterRecord>(2, true);
  const torch::Tensor h = first(x, record.get(), real);
  const torch::Tensor out = second(h, record.get(), real);
  // The language-model part stands in as 0 · the output: only the router losses' gradient.
  const torch::Tensor lm = out.sum() * 0.0;
  const RouterTotals totals = record->totals(lm);
  const RouterLosses got = router_losses(totals);
  (lm + got.weighted(c.moe)).backward();
  EXPECT_DOUBLE_EQ(totals.rows.item<double>(), 2 * 8.0);
  EXPECT_DOUBLE_EQ(totals.counts.sum().item<double>(), 2 * 8.0 * 2);  // k = 2 choices a token
  // Every (token, expert) choice, padding included, as the experts' load.
  EXPECT_DOUBLE_EQ(record->load().sum().item<double>(), 2 * 10.0 * 2);

  std::vector<torch::Tensor> grads = {first->gate->weight.grad().clone(),
                                      second->gate->weight.grad().clone()};
  for (SparseMoe* m : {&first, &second}) (*m)->gate->weight.mutable_grad() = torch::Tensor();
  const torch::Tensor flat = x.reshape({-1, c.hidden_size});
  const torch::Tensor l0 = torch::matmul(flat, first->gate->weight.t());
  // (Through the first layer's output too, as in transformers: a new graph of it.)
  const torch::Tensor l1 =
      torch::matmul(first(x).reshape({-1, c.hidden_size}), second->gate->weight.t());
  const auto [aux, z] = reference_router_losses({l0, l1}, real.reshape({-1}).to(torch::kFloat), 2);
  EXPECT_LT(relative(got.aux, aux), 1e-6);
  EXPECT_LT(relative(got.z, z), 1e-6);
  EXPECT_GT(aux.item<double>(), 1.0);  // E · Σ f·P ≥ 1, with equality only when balanced
  (aux * 0.5 + z * 0.25).backward();
  EXPECT_LT(relative(grads[0], first->gate->weight.grad()), 1e-5);
  EXPECT_LT(relative(grads[1], second->gate->weight.grad()), 1e-5);
}

// model.router_dtype: float32: in a bf16 model the router's logits are the float32 product of the
// bf16 input and weight (here seen through the z-loss's sum of logsumexp², which reads them), not
// the bf16 one.
TEST(RouterLosses, Float32RouterLogitsInABf16Model) {
  ModelConfig c = moe_config("qwen3_moe", 16, true);
  c.moe.z_loss_coef = 1.0;
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({6, c.hidden_size}).to(torch::kBFloat16);
  std::vector<double> z;
  for (const bool float32 : {false, true}) {
    c.moe.float32_router = float32;
    torch::manual_seed(9);
    SparseMoe moe(c, Materialize::kYes, 0);
    randomize(*moe);
    moe->to(torch::kBFloat16);
    const auto record = c10::make_intrusive<RouterRecord>(1, true);
    moe(x, record.get());
    z.push_back(router_losses(record->totals(torch::Tensor())).z.item<double>());
    const torch::Tensor logits =
        float32 ? torch::matmul(x.to(torch::kFloat), moe->gate->weight.to(torch::kFloat).t())
                : torch::matmul(x, moe->gate->weight.t()).to(torch::kFloat);
    const double want = torch::logsumexp(logits, -1).square().mean().item<double>();
    EXPECT_NEAR(z.back(), want, 1e-6 * want) << (float32 ? "float32" : "bf16");
  }
  EXPECT_NE(z[0], z[1]);  // the bf16 logits' rounding shows
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
