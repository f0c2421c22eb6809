#include "model/model_config.h"

#include <cmath>

#include <gtest/gtest.h>

#include "test_util.h"

namespace dstrain::model {
namespace {

using nlohmann::json;
using testing::expect_error;
using testing::small_config_json;

TEST(ModelConfig, TinyConfigParsesEveryField) {
  const ModelConfig c = load_model_config(testing::tiny_config_path());
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.architectures, std::vector<std::string>{"LlamaForCausalLM"});
  EXPECT_EQ(c.vocab_size, 258);
  EXPECT_EQ(c.hidden_size, 128);
  EXPECT_EQ(c.num_hidden_layers, 4);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{256});
  EXPECT_EQ(c.pad_token_id.value_or(-1), 257);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_EQ(c.torch_dtype, "float32");
  EXPECT_EQ(c.rope_scaling.type, "default");
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
}

TEST(ModelConfig, MissingKeyNamesFileAndKey) {
  json doc = small_config_json();
  doc.erase("hidden_size");
  expect_error([&] { parse_model_config(doc, "/m/config.json"); }, ErrorKind::kInput,
               {"/m/config.json", "'hidden_size'", "missing"});
}

TEST(ModelConfig, WrongTypeNamesKeyAndValue) {
  json doc = small_config_json();
  doc["num_attention_heads"] = "four";
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput,
               {"config.json", "num_attention_heads", "\"four\""});
}

TEST(ModelConfig, UnknownModelTypeListsSupportedOnes) {
  json doc = small_config_json("gpt2");
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput,
               {"'gpt2'", "llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, mixtral"});
}

// The MoE families' keys as their config classes default them, which layers are MoE, the
// parameter counts (total and active) and what is refused, naming the key.
TEST(ModelConfig, MixtureOfExpertsKeysDefaultsAndRefusals) {
  json q3 = small_config_json("qwen3_moe");
  q3["num_hidden_layers"] = 4;
  q3["num_experts"] = 8;
  q3["num_experts_per_tok"] = 2;
  q3["moe_intermediate_size"] = 16;
  q3["mlp_only_layers"] = {1};
  ModelConfig c = parse_model_config(q3);
  EXPECT_EQ(c.moe.experts, 8);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.expert_size, 16);
  EXPECT_FALSE(c.moe.norm_topk_prob);
  EXPECT_FALSE(c.moe.float32_weights);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.head_dim, c.hidden_size / c.num_attention_heads);  // not Qwen3's 128
  const std::vector<bool> moe = {c.is_moe_layer(0), c.is_moe_layer(1), c.is_moe_layer(2),
                                 c.is_moe_layer(3)};
  EXPECT_EQ(moe, (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(c.moe_layers(), 3);
  EXPECT_EQ(c.moe_layer_slot(3), 2);  // the third MoE layer
  // Total and active: a MoE layer holds E experts of 3·C·I and runs top_k of them.
  const int64_t C = c.hidden_size;
  EXPECT_EQ(c.num_parameters(false) - c.num_parameters(false, true), 3 * (8 - 2) * 3 * C * 16);
  q3["decoder_sparse_step"] = 2;
  c = parse_model_config(q3);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(1));  // in mlp_only_layers
  EXPECT_TRUE(c.is_moe_layer(3));

  json mixtral = small_config_json("mixtral");
  mixtral["num_local_experts"] = 4;
  c = parse_model_config(mixtral);
  EXPECT_EQ(c.moe.experts, 4);
  EXPECT_EQ(c.moe.top_k, 2);
  EXPECT_EQ(c.moe.expert_size, c.intermediate_size);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_TRUE(c.moe.float32_weights);
  EXPECT_FALSE(c.sliding_window);

  json q2 = small_config_json("qwen2_moe");
  q2["num_experts"] = 4;
  q2["shared_expert_intermediate_size"] = 24;
  c = parse_model_config(q2);
  EXPECT_EQ(c.moe.shared_expert_size, 24);
  EXPECT_EQ(c.moe.top_k, 4);
  EXPECT_TRUE(c.qkv_bias);

  const auto refused = [](json doc, const std::string& key, const json& value,
                          const std::string& why) {
    doc[key] = value;
    expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput, {key, why});
  };
  EXPECT_FALSE(parse_model_config(q3).moe.aux_loss);
  q3["output_router_logits"] = true;
  q3["router_aux_loss_coef"] = 0.02;
  c = parse_model_config(q3);
  EXPECT_TRUE(c.moe.aux_loss);
  EXPECT_DOUBLE_EQ(c.moe.aux_loss_coef, 0.02);
  EXPECT_TRUE(c.moe.router_losses());
  q3.erase("output_router_logits");
  refused(mixtral, "router_jitter_noise", 0.01, "router jitter");
  refused(mixtral, "sliding_window", 4096, "full attention only");
  refused(q2, "use_sliding_window", true, "full attention only");
  refused(q3, "num_experts_per_tok", 9, "between 1 and the 8 experts");
  refused(q3, "mlp_only_layers", json::array({7}), "holds layer 7");
}

TEST(ModelConfig, KeyValueHeadsMustDivideHeads) {
  json doc = small_config_json();
  doc["num_key_value_heads"] = 3;
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput, {"num_key_value_heads", "(3)"});
}

TEST(ModelConfig, MissingFileIsInputError) {
  expect_error([&] { load_model_config("/nonexistent/dir/config.json"); }, ErrorKind::kInput,
               {"/nonexistent/dir/config.json"});
}

TEST(ModelConfig, DefaultsFollowHuggingFace) {
  json doc = small_config_json();
  doc.erase("num_key_value_heads");
  doc.erase("rope_theta");
  const ModelConfig c = parse_model_config(doc);
  EXPECT_EQ(c.num_key_value_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.initializer_range, 0.02);
  EXPECT_FALSE(c.qkv_bias);
}

TEST(ModelConfig, FamilySwitches) {
  const ModelConfig qwen2 = parse_model_config(small_config_json("qwen2"));
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_FALSE(qwen2.o_bias);
  EXPECT_FALSE(qwen2.qk_norm);

  json q3 = small_config_json("qwen3");
  const ModelConfig qwen3 = parse_model_config(q3);
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_FALSE(qwen3.qkv_bias);
  EXPECT_EQ(qwen3.head_dim, 128);  // Qwen3Config's default, not hidden / heads

  json llama = small_config_json("llama");
  llama["attention_bias"] = true;
  const ModelConfig lb = parse_model_config(llama);
  EXPECT_TRUE(lb.qkv_bias);
  EXPECT_TRUE(lb.o_bias);

  json mistral = small_config_json("mistral");
  mistral["sliding_window"] = 4096;
  EXPECT_EQ(parse_model_config(mistral).sliding_window.value_or(0), 4096);
  mistral["sliding_window"] = nullptr;
  EXPECT_FALSE(parse_model_config(mistral).sliding_window.has_value());
}

std::vector<std::string> kinds(const ModelConfig& c) {
  std::vector<std::string> out;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    out.push_back(c.attention_window(l) ? "s" + std::to_string(*c.attention_window(l)) : "full");
  return out;
}

TEST(ModelConfig, SlidingWindowLayersAsTransformersSetsThem) {
  using V = std::vector<std::string>;
  json mistral = small_config_json("mistral");
  mistral["num_hidden_layers"] = 3;
  EXPECT_EQ(kinds(parse_model_config(mistral)), (V{"s4096", "s4096", "s4096"}));  // default
  mistral["sliding_window"] = 16;
  mistral["layer_types"] = {"full_attention", "full_attention", "full_attention"};  // ignored
  EXPECT_EQ(kinds(parse_model_config(mistral)), (V{"s16", "s16", "s16"}));
  mistral["sliding_window"] = nullptr;
  EXPECT_EQ(kinds(parse_model_config(mistral)), (V{"full", "full", "full"}));

  json qwen = small_config_json("qwen2");
  qwen["num_hidden_layers"] = 3;
  qwen["sliding_window"] = 8;
  EXPECT_EQ(kinds(parse_model_config(qwen)), (V{"full", "full", "full"}));  // not enabled
  qwen["use_sliding_window"] = true;
  EXPECT_EQ(kinds(parse_model_config(qwen)), (V{"full", "full", "full"}));  // max_window_layers 28
  qwen["max_window_layers"] = 1;
  EXPECT_EQ(kinds(parse_model_config(qwen)), (V{"full", "s8", "s8"}));
  qwen["layer_types"] = {"sliding_attention", "attention", "full_attention"};  // wins
  EXPECT_EQ(kinds(parse_model_config(qwen)), (V{"s8", "full", "full"}));
  qwen.erase("sliding_window");
  EXPECT_EQ(kinds(parse_model_config(qwen)), (V{"s4096", "full", "full"}));

  json qwen3 = small_config_json("qwen3");
  qwen3["use_sliding_window"] = true;
  qwen3["sliding_window"] = nullptr;  // Qwen3Config: no window, every layer full
  qwen3["max_window_layers"] = 0;
  EXPECT_EQ(kinds(parse_model_config(qwen3)), (V{"full", "full"}));
  qwen3["sliding_window"] = 6;
  EXPECT_EQ(kinds(parse_model_config(qwen3)), (V{"s6", "s6"}));

  json llama = small_config_json("llama");
  llama["sliding_window"] = 8;
  EXPECT_EQ(kinds(parse_model_config(llama)), (V{"full", "full"}));
}

TEST(ModelConfig, BadLayerTypesNameTheKey) {
  json doc = small_config_json("qwen2");
  doc["use_sliding_window"] = true;
  doc["sliding_window"] = 8;
  doc["layer_types"] = {"full_attention"};
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput,
               {"'layer_types'", "1 entries", "num_hidden_layers is 2"});
  doc["layer_types"] = {"full_attention", "linear_attention"};
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput,
               {"'layer_types'", "[1]", "'linear_attention'"});
  doc["layer_types"] = {"full_attention", "sliding_attention"};
  doc["use_sliding_window"] = false;
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput,
               {"'layer_types'", "[1]", "no window"});
}

TEST(ModelConfig, Llama3RopeScalingParsed) {
  json doc = small_config_json();
  doc["rope_theta"] = 500000.0;
  doc["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 32.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
  const ModelConfig c = parse_model_config(doc);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
}

TEST(ModelConfig, RopeScalingAcceptsOldTypeKeyAndLinear) {
  json doc = small_config_json();
  doc["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  const ModelConfig c = parse_model_config(doc);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
}

TEST(ModelConfig, RopeParametersCarryTheta) {
  json doc = small_config_json();
  doc.erase("rope_theta");
  doc["rope_parameters"] = {{"rope_theta", 1000000.0}, {"rope_type", "default"}};
  const ModelConfig c = parse_model_config(doc);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.rope_scaling.type, "default");
}

TEST(ModelConfig, UnsupportedRopeTypeNamesKey) {
  json doc = small_config_json();
  doc["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}};
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput,
               {"rope_scaling.rope_type", "'longrope'", "llama3, yarn, dynamic"});
}

TEST(ModelConfig, YarnKeysWithTransformersDefaults) {
  // Qwen2.5's long-context recipe: only factor, original context and the type.
  json doc = small_config_json("qwen2");
  doc["rope_scaling"] = {
      {"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  RopeScaling s = parse_model_config(doc).rope_scaling;
  EXPECT_EQ(s.type, "yarn");
  EXPECT_DOUBLE_EQ(s.factor, 4.0);
  EXPECT_EQ(s.original_max_position_embeddings, 32);
  EXPECT_DOUBLE_EQ(s.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(s.beta_slow, 1.0);
  EXPECT_FALSE(s.attention_factor.has_value());
  EXPECT_TRUE(s.truncate);
  // Without original_max_position_embeddings, transformers takes max_position_embeddings (128).
  doc["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0},           {"beta_fast", 16},
                         {"beta_slow", 2},      {"attention_factor", 1.5}, {"truncate", false}};
  s = parse_model_config(doc).rope_scaling;
  EXPECT_EQ(s.original_max_position_embeddings, 128);
  EXPECT_DOUBLE_EQ(s.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(s.beta_slow, 2.0);
  EXPECT_DOUBLE_EQ(s.attention_factor.value_or(0), 1.5);
  EXPECT_FALSE(s.truncate);
}

TEST(ModelConfig, BadYarnAndDynamicKeysNameTheKey) {
  json doc = small_config_json();
  doc["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"attention_factor", -1.0}};
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput,
               {"rope_scaling.attention_factor", "> 0"});
  doc["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", "yes"}};
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput, {"rope_scaling.truncate"});
  doc["rope_scaling"] = {{"rope_type", "dynamic"}};
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput, {"rope_scaling.factor"});
}

TEST(ModelConfig, Llama3ScalingWithoutOriginalContextIsError) {
  json doc = small_config_json();
  doc["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput,
               {"rope_scaling.original_max_position_embeddings"});
}

TEST(ModelConfig, DtypeKeysAndEosList) {
  json doc = small_config_json();
  doc["dtype"] = "bfloat16";
  doc["eos_token_id"] = {128001, 128008, 128009};
  doc["bos_token_id"] = 128000;
  const ModelConfig c = parse_model_config(doc);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{128001, 128008, 128009}));
  EXPECT_EQ(c.bos_token_id.value_or(0), 128000);
  doc.erase("dtype");
  doc["torch_dtype"] = "int8";
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput, {"torch_dtype", "'int8'"});
}

TEST(ModelConfig, OnlySiluActivationAccepted) {
  json doc = small_config_json();
  doc["hidden_act"] = "gelu";
  expect_error([&] { parse_model_config(doc); }, ErrorKind::kInput, {"hidden_act", "gelu"});
}

TEST(ModelConfig, ParameterCountAndFlopsFormula) {
  // Qwen2.5-0.5B: 494,032,768 parameters in total (tied), 357,898,112 without the embedding.
  json doc = {{"model_type", "qwen2"},    {"vocab_size", 151936},
              {"hidden_size", 896},       {"intermediate_size", 4864},
              {"num_hidden_layers", 24},  {"num_attention_heads", 14},
              {"num_key_value_heads", 2}, {"tie_word_embeddings", true}};
  const ModelConfig c = parse_model_config(doc);
  EXPECT_EQ(c.num_parameters(true), 494032768);
  EXPECT_EQ(c.num_parameters(false), 494032768 - 151936 * 896);
  // The tied LM head does matmul work (V·C per token, ~30% of this model); the lookup does not.
  const double n = static_cast<double>(c.num_parameters(false)) + 151936.0 * 896;
  EXPECT_DOUBLE_EQ(c.training_flops_per_token(1024), 6 * n + 12.0 * 24 * 14 * 64 * 1024);
  // With a 256-token window on the upper 20 layers, those attend to 256 keys instead of 1024.
  doc["use_sliding_window"] = true;
  doc["sliding_window"] = 256;
  doc["max_window_layers"] = 4;
  EXPECT_DOUBLE_EQ(parse_model_config(doc).training_flops_per_token(1024),
                   6 * n + 12.0 * 14 * 64 * (4 * 1024 + 20 * 256));
}

TEST(ModelConfig, ToJsonRoundTrips) {
  json doc = small_config_json("qwen3");
  doc["head_dim"] = 24;
  doc["custom_key"] = "kept";
  const ModelConfig c = parse_model_config(doc);
  const json out = to_json(c, "bfloat16");
  EXPECT_EQ(out["custom_key"], "kept");
  EXPECT_EQ(out["torch_dtype"], "bfloat16");
  const ModelConfig back = parse_model_config(out);
  EXPECT_EQ(back.head_dim, 24);
  EXPECT_EQ(back.num_parameters(true), c.num_parameters(true));
}

}  // namespace
}  // namespace dstrain::model
