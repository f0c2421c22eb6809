#include "model/model.h"

#include <cmath>
#include <map>

#include <gtest/gtest.h>

#include "test_util.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model {
namespace {

using nlohmann::json;
using testing::random_ids;
using testing::small_config;
using testing::small_config_json;

std::vector<std::string> parameter_names(DecoderModelImpl& m) {
  std::vector<std::string> names;
  for (const auto& item : m.named_parameters()) names.push_back(item.key());
  return names;
}

// The Hugging Face state-dict names, in the order transformers registers them.
std::vector<std::string> hf_names(const ModelConfig& c) {
  std::vector<std::string> n = {"model.embed_tokens.weight"};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* proj : {"q", "k", "v", "o"}) {
      n.push_back(p + "self_attn." + proj + "_proj.weight");
      const bool bias = std::string(proj) == "o" ? c.o_bias : c.qkv_bias;
      if (bias) n.push_back(p + "self_attn." + proj + "_proj.bias");
    }
    if (c.qk_norm) {
      n.push_back(p + "self_attn.q_norm.weight");
      n.push_back(p + "self_attn.k_norm.weight");
    }
    for (const char* proj : {"gate", "up", "down"}) n.push_back(p + "mlp." + proj + "_proj.weight");
    n.push_back(p + "input_layernorm.weight");
    n.push_back(p + "post_attention_layernorm.weight");
  }
  n.push_back("model.norm.weight");
  if (!c.tie_word_embeddings) n.push_back("lm_head.weight");
  return n;
}

int64_t counted_parameters(DecoderModelImpl& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

// Hand-written forward with plain tensor ops (explicit RoPE per pair, explicit [T, T] causal mask,
// narrowed to the layer's window where it has one, KV head h / groups for query head h), to check
// the modules against.
torch::Tensor rms(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return w * (x * torch::rsqrt(x.pow(2).mean(-1, true) + eps));
}

torch::Tensor rope_by_pairs(const torch::Tensor& x, double theta) {  // x [B, T, heads, D]
  const int64_t T = x.size(1), D = x.size(3), half = D / 2;
  torch::Tensor out = x.clone();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = t * std::pow(theta, -2.0 * i / D);
      const torch::Tensor a = x.select(1, t).select(-1, i), b = x.select(1, t).select(-1, i + half);
      out.select(1, t).select(-1, i).copy_(a * std::cos(angle) - b * std::sin(angle));
      out.select(1, t).select(-1, i + half).copy_(b * std::cos(angle) + a * std::sin(angle));
    }
  return out;
}

// differentiable: read the parameters themselves (not detached copies), so backward reaches them.
torch::Tensor reference_forward(DecoderModelImpl& m, const torch::Tensor& ids,
                                bool differentiable = false) {
  const ModelConfig& c = m.config();
  std::map<std::string, torch::Tensor> P;
  for (const auto& item : m.named_parameters())
    P[item.key()] = differentiable ? item.value() : item.value().detach();
  auto lin = [&](const torch::Tensor& x, const std::string& name) {
    torch::Tensor y = torch::matmul(x, P.at(name + ".weight").t());
    return P.count(name + ".bias") ? y + P.at(name + ".bias") : y;
  };
  const int64_t B = ids.size(0), T = ids.size(1), H = c.num_attention_heads, D = c.head_dim;
  const int64_t groups = H / c.num_key_value_heads;
  torch::Tensor h =
      P.at("model.embed_tokens.weight").index_select(0, ids.reshape({-1})).view({B, T, -1});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    torch::Tensor mask = torch::ones({T, T}, torch::kBool).triu(1);  // true: hidden
    if (const auto w = c.attention_window(l)) mask |= torch::ones({T, T}, torch::kBool).tril(-*w);
    const torch::Tensor x = rms(h, P.at(p + "input_layernorm.weight"), c.rms_norm_eps);
    torch::Tensor q = lin(x, p + "self_attn.q_proj").view({B, T, H, D});
    torch::Tensor k = lin(x, p + "self_attn.k_proj").view({B, T, -1, D});
    const torch::Tensor v = lin(x, p + "self_attn.v_proj").view({B, T, -1, D});
    if (c.qk_norm) {
      q = rms(q, P.at(p + "self_attn.q_norm.weight"), c.rms_norm_eps);
      k = rms(k, P.at(p + "self_attn.k_norm.weight"), c.rms_norm_eps);
    }
    q = rope_by_pairs(q, c.rope_theta);
    k = rope_by_pairs(k, c.rope_theta);
    std::vector<torch::Tensor> heads;
    for (int64_t hd = 0; hd < H; ++hd) {
      const torch::Tensor qh = q.select(2, hd), kh = k.select(2, hd / groups),
                          vh = v.select(2, hd / groups);
      torch::Tensor s = torch::matmul(qh, kh.transpose(1, 2)) / std::sqrt(static_cast<double>(D));
      heads.push_back(torch::matmul(s.masked_fill(mask, -INFINITY).softmax(-1), vh));
    }
    h = h + lin(torch::cat(heads, -1), p + "self_attn.o_proj");
    const torch::Tensor y = rms(h, P.at(p + "post_attention_layernorm.weight"), c.rms_norm_eps);
    h = h + lin(torch::silu(lin(y, p + "mlp.gate_proj")) * lin(y, p + "mlp.up_proj"),
                p + "mlp.down_proj");
  }
  h = rms(h, P.at("model.norm.weight"), c.rms_norm_eps);
  const std::string head = c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  return torch::matmul(h, P.at(head).t());
}

// Gives biases and norm weights non-trivial values so the reference comparison sees them.
void perturb(DecoderModelImpl& m) {
  torch::NoGradGuard g;
  torch::manual_seed(11);
  for (auto& item : m.named_parameters())
    if (item.key().find("bias") != std::string::npos ||
        item.key().find("norm") != std::string::npos)
      item.value().add_(torch::randn_like(item.value()) * 0.3);
}

TEST(DecoderModel, TinyForwardGivesFiniteLogitsOfRightShape) {
  const ModelConfig c = load_model_config(testing::tiny_config_path());
  DecoderModel m = build_model(c, torch::kFloat, 1);
  const torch::Tensor logits = m->forward(random_ids(2, 33, c.vocab_size, 1));
  EXPECT_EQ(logits.sizes(), (c10::IntArrayRef{2, 33, 258}));
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
}

TEST(DecoderModel, RandomInitLossIsLnVocab) {
  const ModelConfig c = load_model_config(testing::tiny_config_path());
  DecoderModel m = build_model(c, torch::kFloat, 7);
  // Labels independent of the inputs: with a tied head, a random model scores the input token
  // itself higher (its embedding is still in the residual stream), so labels == inputs would read
  // lower.
  const torch::Tensor ids = random_ids(4, 64, 256, 2);
  const torch::Tensor labels = random_ids(4, 64, 256, 3);
  const double loss = causal_lm_loss(m->forward(ids), labels).item<double>();
  EXPECT_NEAR(loss, std::log(258.0), 0.1);
}

TEST(DecoderModel, TinyLlamaHasExactHfNamesAndCount) {
  const ModelConfig c = load_model_config(testing::tiny_config_path());
  DecoderModel m(c);
  EXPECT_EQ(parameter_names(*m), hf_names(c));
  EXPECT_EQ(counted_parameters(*m), c.num_parameters(true));
}

struct FamilyCase {
  std::string name;
  json patch;
};

void PrintTo(const FamilyCase& f, std::ostream* os) {
  *os << f.name;
}

class Families : public ::testing::TestWithParam<FamilyCase> {};

ModelConfig family_config(const FamilyCase& f) {
  json doc = small_config_json(f.patch.value("model_type", "llama"));
  doc.merge_patch(f.patch);
  return parse_model_config(doc);
}

TEST_P(Families, ExactHfNamesCountAndForwardMatchesReference) {
  const ModelConfig c = family_config(GetParam());
  DecoderModel m = build_model(c, torch::kFloat, 3);
  perturb(*m);
  EXPECT_EQ(parameter_names(*m), hf_names(c));
  EXPECT_EQ(counted_parameters(*m), c.num_parameters(true));
  const torch::Tensor ids = random_ids(2, 9, c.vocab_size, 4);
  torch::NoGradGuard g;
  const torch::Tensor logits = m->forward(ids);
  ASSERT_EQ(logits.sizes(), (c10::IntArrayRef{2, 9, c.vocab_size}));
  if (c.rope_scaling.type == "default")  // the reference implements unscaled RoPE only
    EXPECT_TRUE(torch::allclose(logits, reference_forward(*m, ids), 1e-4, 1e-5));
  else
    EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
}

INSTANTIATE_TEST_SUITE_P(
    Model, Families,
    ::testing::Values(FamilyCase{"Llama", json::object()},
                      FamilyCase{"LlamaAttentionBiasTied",
                                 {{"attention_bias", true}, {"tie_word_embeddings", true}}},
                      FamilyCase{"Llama3RopeScaling",
                                 {{"rope_theta", 500000.0},
                                  {"rope_scaling",
                                   {{"rope_type", "llama3"},
                                    {"factor", 8.0},
                                    {"low_freq_factor", 1.0},
                                    {"high_freq_factor", 4.0},
                                    {"original_max_position_embeddings", 64}}}}},
                      FamilyCase{"Mistral", {{"model_type", "mistral"}, {"sliding_window", 64}}},
                      FamilyCase{"MistralWindowShorterThanSequence",
                                 {{"model_type", "mistral"}, {"sliding_window", 3}}},
                      FamilyCase{"Qwen2WindowOnUpperLayer",
                                 {{"model_type", "qwen2"},
                                  {"use_sliding_window", true},
                                  {"sliding_window", 4},
                                  {"max_window_layers", 1}}},
                      FamilyCase{"Qwen2Bias",
                                 {{"model_type", "qwen2"},
                                  {"rope_theta", 1000000.0},
                                  {"tie_word_embeddings", true}}},
                      FamilyCase{"Qwen3HeadDim", {{"model_type", "qwen3"}, {"head_dim", 24}}}),
    [](const auto& info) { return info.param.name; });

TEST(DecoderModel, GroupedQueryShapes) {
  json doc = small_config_json("qwen3");
  doc["head_dim"] = 24;  // != hidden / heads = 16
  DecoderModel m(parse_model_config(doc));
  auto attn = m->decoder_layer(0)->self_attn;
  EXPECT_EQ(attn->q_proj->weight.sizes(), (c10::IntArrayRef{4 * 24, 64}));
  EXPECT_EQ(attn->k_proj->weight.sizes(), (c10::IntArrayRef{2 * 24, 64}));
  EXPECT_EQ(attn->v_proj->weight.sizes(), (c10::IntArrayRef{2 * 24, 64}));
  EXPECT_EQ(attn->o_proj->weight.sizes(), (c10::IntArrayRef{64, 4 * 24}));
  EXPECT_EQ(attn->q_norm->weight.sizes(), (c10::IntArrayRef{24}));
}

TEST(DecoderModel, GroupedQueryEqualsMultiHeadWithRepeatedKeyValueHeads) {
  const ModelConfig gqa = small_config();
  json mha_doc = small_config_json();
  mha_doc["num_key_value_heads"] = 4;
  DecoderModel a = build_model(gqa, torch::kFloat, 5);
  DecoderModel b = build_model(parse_model_config(mha_doc), torch::kFloat, 6);
  torch::NoGradGuard g;
  auto pb = b->named_parameters();
  for (const auto& item : a->named_parameters()) {
    torch::Tensor w = item.value();
    if (item.key().find("k_proj") != std::string::npos ||
        item.key().find("v_proj") != std::string::npos)
      w = w.view({2, 1, 16, 64})
              .expand({2, 2, 16, 64})
              .reshape({64, 64});  // kv head j → q heads 2j, 2j+1
    pb[item.key()].copy_(w);
  }
  const torch::Tensor ids = random_ids(1, 12, 97, 8);
  EXPECT_TRUE(torch::allclose(a->forward(ids), b->forward(ids), 1e-5, 1e-6));
}

TEST(DecoderModel, FutureTokenDoesNotChangeEarlierLogits) {
  DecoderModel m = build_model(small_config(), torch::kFloat, 9);
  torch::Tensor ids = random_ids(1, 16, 97, 10);
  torch::NoGradGuard g;
  const torch::Tensor before = m->forward(ids);
  ids[0][10] = (ids[0][10].item<int64_t>() + 1) % 97;
  const torch::Tensor after = m->forward(ids);
  EXPECT_TRUE(torch::equal(before.slice(1, 0, 10), after.slice(1, 0, 10)));
  EXPECT_FALSE(torch::allclose(before.slice(1, 10), after.slice(1, 10)));
}

TEST(DecoderModel, TiedHeadIsTheEmbeddingUntiedHasItsOwn) {
  json doc = small_config_json();
  doc["tie_word_embeddings"] = true;
  const ModelConfig tied_cfg = parse_model_config(doc);
  DecoderModel tied = build_model(tied_cfg, torch::kFloat, 1);
  DecoderModel untied = build_model(small_config(), torch::kFloat, 2);
  EXPECT_FALSE(tied->named_parameters().contains("lm_head.weight"));
  EXPECT_TRUE(untied->named_parameters().contains("lm_head.weight"));
  EXPECT_EQ(small_config().num_parameters(true) - tied_cfg.num_parameters(true), 97 * 64);
  EXPECT_EQ(small_config().num_parameters(false), tied_cfg.num_parameters(false));
  // An untied model whose lm_head is a copy of the tied model's embedding computes the same logits.
  torch::NoGradGuard g;
  auto pu = untied->named_parameters();
  for (const auto& item : tied->named_parameters()) pu[item.key()].copy_(item.value());
  pu["lm_head.weight"].copy_(tied->model->embed_tokens->weight);
  const torch::Tensor ids = random_ids(1, 6, 97, 3);
  EXPECT_TRUE(torch::allclose(tied->forward(ids), untied->forward(ids), 1e-5, 1e-6));
  // Changing an embedding row the input never uses still changes that vocabulary column.
  torch::Tensor unused = torch::ones({97}, torch::kBool);
  unused.index_put_({ids.reshape({-1})}, false);
  const int64_t row = unused.nonzero()[0][0].item<int64_t>();
  const torch::Tensor before = tied->forward(ids);
  tied->model->embed_tokens->weight[row].add_(1.0);
  const torch::Tensor after = tied->forward(ids);
  EXPECT_FALSE(torch::allclose(before.select(-1, row), after.select(-1, row)));
  EXPECT_TRUE(torch::equal(before.narrow(-1, 0, row), after.narrow(-1, 0, row)));
}

TEST(DecoderModel, InitIsDeterministicAndFollowsHf) {
  json doc = small_config_json("qwen2");
  doc["pad_token_id"] = 5;
  doc["initializer_range"] = 0.05;
  const ModelConfig c = parse_model_config(doc);
  DecoderModel a = build_model(c, torch::kFloat, 42), b = build_model(c, torch::kFloat, 42);
  DecoderModel other = build_model(c, torch::kFloat, 43);
  auto pa = a->named_parameters(), pb = b->named_parameters(), po = other->named_parameters();
  for (const auto& item : pa) EXPECT_TRUE(torch::equal(item.value(), pb[item.key()])) << item.key();
  EXPECT_FALSE(torch::equal(pa["model.layers.0.mlp.up_proj.weight"],
                            po["model.layers.0.mlp.up_proj.weight"]));
  EXPECT_TRUE(torch::equal(pa["model.norm.weight"], torch::ones({64})));
  EXPECT_TRUE(torch::equal(pa["model.layers.1.self_attn.q_proj.bias"], torch::zeros({64})));
  EXPECT_TRUE(torch::equal(pa["model.embed_tokens.weight"][5], torch::zeros({64})));
  EXPECT_NEAR(pa["model.layers.0.mlp.gate_proj.weight"].std().item<double>(), 0.05, 0.003);
  EXPECT_NEAR(pa["model.embed_tokens.weight"].mean().item<double>(), 0.0, 0.003);
}

TEST(DecoderModel, Bf16ModelRunsInBf16) {
  DecoderModel m = build_model(small_config(), torch::kBFloat16, 1);
  for (const auto& p : m->parameters()) EXPECT_EQ(p.scalar_type(), torch::kBFloat16);
  const torch::Tensor logits = m->forward(random_ids(2, 8, 97, 1));
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
}

// A token reaches position i only through attention: with window W it moves W - 1 positions per
// layer, so over L layers it reaches at most L·(W - 1) positions further.
TEST(DecoderModel, SlidingWindowBoundsHowFarATokenReaches) {
  json doc = small_config_json("mistral");
  doc["sliding_window"] = 4;
  DecoderModel m = build_model(parse_model_config(doc), torch::kFloat, 9);
  torch::Tensor ids = random_ids(1, 24, 97, 10);
  torch::NoGradGuard g;
  const torch::Tensor before = m->forward(ids);
  ids[0][5] = (ids[0][5].item<int64_t>() + 1) % 97;
  const torch::Tensor after = m->forward(ids);
  const int64_t reach = 5 + 2 * (4 - 1);  // last position token 5 can influence: 11
  EXPECT_TRUE(torch::equal(before.slice(1, 0, 5), after.slice(1, 0, 5)));
  EXPECT_FALSE(torch::allclose(before.select(1, reach), after.select(1, reach)));
  EXPECT_TRUE(torch::allclose(before.slice(1, reach + 1), after.slice(1, reach + 1), 0, 1e-6));
}

TEST(DecoderModel, SlidingWindowGradientsEqualTheDenseMaskReference) {
  json doc = small_config_json("qwen2");
  doc["use_sliding_window"] = true;
  doc["sliding_window"] = 3;
  doc["max_window_layers"] = 1;
  DecoderModel m = build_model(parse_model_config(doc), torch::kFloat, 4);
  perturb(*m);
  const torch::Tensor ids = random_ids(2, 11, 97, 5);
  const torch::Tensor weight = torch::randn({2, 11, 97});
  (reference_forward(*m, ids, /*differentiable=*/true) * weight).sum().backward();
  std::map<std::string, torch::Tensor> want;
  for (const auto& item : m->named_parameters()) {
    want[item.key()] = item.value().grad().clone();
    item.value().mutable_grad().reset();
  }
  (m->forward(ids) * weight).sum().backward();
  // max|got - want| / max|want| per tensor, as the reference suite measures (elementwise
  // tolerances fail on near-zero entries of a sum over tokens).
  for (const auto& item : m->named_parameters()) {
    const torch::Tensor& w = want[item.key()];
    const double rel = ((item.value().grad() - w).abs().max() / w.abs().max()).item<double>();
    EXPECT_LT(rel, 1e-5) << item.key();
  }
}

// Each wrapper goes into its slot: graphs innermost, then checkpointing, then the engine, whatever
// the order they were installed in; a slot takes one wrapper.
TEST(DecoderModel, BlockWrappersNestInTheirSlotsOrder) {
  DecoderModel m = build_model(small_config(), torch::kFloat, 1);
  std::vector<std::string> calls;
  auto probe = [&calls](std::string name) {
    return [&calls, name](const ModelBlock& b, const torch::Tensor& x, const BlockContext&,
                          const BlockFn& run) {
      if (b.index == 1) calls.push_back(name);
      return run(x);
    };
  };
  m->wrap_blocks(WrapperSlot::kCheckpointing, probe("checkpointing"));
  m->wrap_blocks(WrapperSlot::kEngine, probe("engine"));
  m->wrap_blocks(WrapperSlot::kGraphs, probe("graphs"));
  (void)m->forward(random_ids(1, 4, 97, 1));
  EXPECT_EQ(calls, (std::vector<std::string>{"engine", "checkpointing", "graphs"}));
  testing::expect_error([&] { m->wrap_blocks(WrapperSlot::kGraphs, probe("again")); },
                        ErrorKind::kInternal, {"holds a wrapper already"});
  m->unwrap_blocks();
  m->wrap_blocks(WrapperSlot::kGraphs, probe("again"));
  calls.clear();
  (void)m->forward(random_ids(1, 4, 97, 1));
  EXPECT_EQ(calls, std::vector<std::string>{"again"});
}

TEST(DecoderModel, BlockWrappersRunAroundEveryLayerForwardAndBackward) {
  DecoderModel m = build_model(small_config(), torch::kFloat, 1);
  std::vector<std::string> events;
  m->wrap_blocks(WrapperSlot::kEngine, [&](const ModelBlock& b, const torch::Tensor& x,
                                           const BlockContext&, const BlockFn& run) {
    if (b.role != BlockRole::kLayer) return run(x);
    const int64_t i = static_cast<int64_t>(b.index) - 1;
    events.push_back("before" + std::to_string(i));
    const_cast<torch::Tensor&>(x).register_hook([&events, i](torch::Tensor g) {
      events.push_back("backward_done" + std::to_string(i));
      return g;
    });
    torch::Tensor out = run(x);
    events.push_back("after" + std::to_string(i));
    out.register_hook([&events, i](torch::Tensor g) {
      events.push_back("backward_start" + std::to_string(i));
      return g;
    });
    return out;
  });
  const torch::Tensor ids = random_ids(1, 5, 97, 1);
  causal_lm_loss(m->forward(ids), ids).backward();
  // Layer 0's output is layer 1's input: the gradient reaching it ends layer 1's backward and
  // starts layer 0's at the same moment; hooks on one tensor run in registration order.
  const std::vector<std::string> expected = {"before0",        "after0",          "before1",
                                             "after1",         "backward_start1", "backward_start0",
                                             "backward_done1", "backward_done0"};
  EXPECT_EQ(events, expected);
}

// A slice of a sequence (sequence parallelism) gets exactly the whole sequence's rows, dynamic
// RoPE scaled by the whole length even when the slice alone is within max_position_embeddings.
TEST(DecoderModel, RopeOfASliceIsTheWholeSequencesRows) {
  for (const char* type : {"", "dynamic"}) {
    json j = small_config_json();
    j["max_position_embeddings"] = 32;
    if (std::string(type) == "dynamic")
      j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
    DecoderModel m(parse_model_config(j));
    const torch::Tensor like = torch::zeros({1});
    const auto [cos, sin] = m->rope(48, like);
    const auto [cos_slice, sin_slice] = m->rope(12, like, Positions{24, 48, nullptr});
    EXPECT_TRUE(cos_slice.equal(cos.narrow(0, 24, 12))) << type;
    EXPECT_TRUE(sin_slice.equal(sin.narrow(0, 24, 12))) << type;
  }
  DecoderModel m(small_config());
  EXPECT_THROW(m->rope(12, torch::zeros({1}), Positions{40, 48, nullptr}), Error);
}

TEST(CausalLmLoss, IgnoresMinus100AndDoesNotShift) {
  torch::manual_seed(1);
  const torch::Tensor logits = torch::randn({2, 3, 5});
  const torch::Tensor labels = torch::tensor({{1, -100, 4}, {-100, 0, 2}}, torch::kLong);
  const torch::Tensor logp = logits.log_softmax(-1);
  const double expected =
      -(logp[0][0][1] + logp[0][2][4] + logp[1][1][0] + logp[1][2][2]).item<double>() / 4;
  EXPECT_NEAR(causal_lm_loss(logits, labels).item<double>(), expected, 1e-5);
  const LossSum s = causal_lm_loss_sum(logits, labels);
  EXPECT_EQ(s.count.item<int64_t>(), 4);
  EXPECT_NEAR(s.sum.item<double>(), expected * 4, 1e-4);
}

TEST(CausalLmLoss, AllIgnoredGivesZeroNotNan) {
  const torch::Tensor logits = torch::randn({1, 2, 5}, torch::requires_grad());
  const torch::Tensor loss = causal_lm_loss(logits, torch::full({1, 2}, -100, torch::kLong));
  EXPECT_EQ(loss.item<double>(), 0.0);
  loss.backward();
  EXPECT_TRUE(torch::equal(logits.grad(), torch::zeros({1, 2, 5})));
}

TEST(Dtype, ResolveFromNameOrConfig) {
  ModelConfig c = small_config();
  EXPECT_EQ(resolve_dtype("auto", c), torch::kFloat);
  c.torch_dtype = "bfloat16";
  EXPECT_EQ(resolve_dtype("auto", c), torch::kBFloat16);
  EXPECT_EQ(resolve_dtype("float16", c), torch::kHalf);
  testing::expect_error([&] { resolve_dtype("int4", c); }, ErrorKind::kInput, {"'int4'"});
}

}  // namespace
}  // namespace dstrain::model
