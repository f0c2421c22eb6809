// PEFT adapter directories: what we write is what PEFT writes, and reading gives it back exactly.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "core/fs.h"
#include "lora/adapter_io.h"
#include "model/safetensors.h"
#include "tests/unit/lora/lora_test_util.h"

namespace dstrain::lora::testing {
namespace {
using nlohmann::json;

Adapter sample_adapter(LoraOptions o = small_options(), bool moe = false) {
  auto m = moe ? moe_model() : small_model();
  LoraModel lora(m, o, "k");
  randomize_b(lora, 3);
  Adapter a;
  a.options = o;
  a.base_model = "Qwen/Qwen2.5-0.5B";
  for (const auto& w : lora.weights())
    a.weights.push_back({w.module, w.A.detach().clone(), w.B.detach().clone(), {}});
  return a;
}

json read_json(const std::filesystem::path& p) {
  return json::parse(fs::read_file(p));
}

TEST(AdapterIo, RoundTripGivesIdenticalTensorsAndConfig) {
  TempDir dir;
  LoraOptions o = small_options();
  o.dropout = 0.05;
  o.use_rslora = true;
  const Adapter a = sample_adapter(o);
  write_adapter(dir.path(), a);
  const Adapter b = read_adapter(dir.path());
  EXPECT_EQ(b.options.r, 4);
  EXPECT_EQ(b.options.alpha, 8);
  EXPECT_EQ(b.options.dropout, 0.05);
  EXPECT_EQ(b.options.target_modules, o.target_modules);
  EXPECT_FALSE(b.options.target_regex);
  EXPECT_TRUE(b.options.use_rslora);
  EXPECT_EQ(b.base_model, "Qwen/Qwen2.5-0.5B");
  ASSERT_EQ(b.weights.size(), a.weights.size());
  for (size_t i = 0; i < a.weights.size(); ++i) {
    EXPECT_EQ(b.weights[i].module, a.weights[i].module);
    EXPECT_TRUE(torch::equal(b.weights[i].A, a.weights[i].A)) << a.weights[i].module;
    EXPECT_TRUE(torch::equal(b.weights[i].B, a.weights[i].B)) << a.weights[i].module;
  }
}

TEST(AdapterIo, ExpertStacksRoundTripWithTheirTargetParameters) {
  TempDir dir;
  const Adapter a = sample_adapter(stack_options({"mlp.experts.gate_up_proj", "down_proj"}), true);
  write_adapter(dir.path(), a);
  const json cfg = read_json(dir / kAdapterConfigFile);
  EXPECT_EQ(cfg.at("target_parameters"), json({"mlp.experts.gate_up_proj", "down_proj"}));
  model::SafetensorsFile st(dir / kAdapterWeightsFile);
  EXPECT_EQ(st.info("base_model.model.model.layers.1.mlp.experts.base_layer.lora_B.weight").shape,
            (std::vector<int64_t>{32, 16}));
  const Adapter b = read_adapter(dir.path());
  EXPECT_EQ(b.options.target_parameters, a.options.target_parameters);
  ASSERT_EQ(b.weights.size(), a.weights.size());
  // A module trained whole (modules_to_save): its weight under the module's own name.
  Adapter c = a;
  c.options.modules_to_save = {"gate"};
  c.weights.push_back({"model.layers.0.mlp.gate", {}, {}, torch::randn({4, 64})});
  write_adapter(dir.path(), c);
  EXPECT_EQ(read_json(dir / kAdapterConfigFile).at("modules_to_save"), json({"gate"}));
  EXPECT_EQ(model::SafetensorsFile(dir / kAdapterWeightsFile)
                .info("base_model.model.model.layers.0.mlp.gate.weight")
                .shape,
            (std::vector<int64_t>{4, 64}));
  const Adapter d = read_adapter(dir.path());
  ASSERT_TRUE(d.weights.front().is_whole());
  EXPECT_TRUE(torch::equal(d.weights.front().whole, c.weights.back().whole));
  write_adapter(dir.path(), a);
  // PEFT leaves target_modules null where only target_parameters chooses.
  json only = cfg;
  only["target_modules"] = nullptr;
  fs::write_file_atomic(dir / kAdapterConfigFile, only.dump());
  EXPECT_TRUE(read_adapter(dir.path()).options.target_modules.empty());
  only["target_parameters"] = nullptr;
  fs::write_file_atomic(dir / kAdapterConfigFile, only.dump());
  expect_error([&] { read_adapter(dir.path()); }, ErrorKind::kInput,
               {"adapter_config.json", "select nothing"});
}

TEST(AdapterIo, FilesHavePeftNamesShapesAndConfigKeys) {
  TempDir dir;
  write_adapter(dir.path(), sample_adapter());
  model::SafetensorsFile st(dir / kAdapterWeightsFile);
  const auto& a = st.info("base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{4, 64}));  // [r, in]
  EXPECT_EQ(a.dtype, "F32");
  const auto& b = st.info("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
  EXPECT_EQ(b.shape, (std::vector<int64_t>{32, 4}));  // [out, r]
  EXPECT_EQ(st.names().size(), 8u);
  const json c = read_json(dir / kAdapterConfigFile);
  EXPECT_EQ(c.at("peft_type"), "LORA");
  EXPECT_EQ(c.at("task_type"), "CAUSAL_LM");
  EXPECT_EQ(c.at("r"), 4);
  EXPECT_EQ(c.at("lora_alpha"), 8);
  EXPECT_EQ(c.at("target_modules"), json({"q_proj", "v_proj"}));
  EXPECT_EQ(c.at("bias"), "none");
  EXPECT_EQ(c.at("base_model_name_or_path"), "Qwen/Qwen2.5-0.5B");
  EXPECT_EQ(c.at("use_rslora"), false);
  EXPECT_EQ(c.at("fan_in_fan_out"), false);
  EXPECT_EQ(c.at("inference_mode"), true);
  EXPECT_TRUE(c.at("modules_to_save").is_null());
}

TEST(AdapterIo, RegexTargetIsWrittenAsOneStringAndReadBackAsRegex) {
  TempDir dir;
  LoraOptions o = small_options({R"(.*\.(q|v)_proj)"});
  o.target_regex = true;
  write_adapter(dir.path(), sample_adapter(o));
  EXPECT_EQ(read_json(dir / kAdapterConfigFile).at("target_modules"), R"(.*\.(q|v)_proj)");
  const Adapter b = read_adapter(dir.path());
  EXPECT_TRUE(b.options.target_regex);
  EXPECT_EQ(b.options.target_modules, o.target_modules);
  // PEFT's "all-linear" shorthand is a string but not a regex.
  json j = read_json(dir / kAdapterConfigFile);
  j["target_modules"] = "all-linear";
  fs::write_file_atomic(dir / kAdapterConfigFile, j.dump());
  const Adapter c = read_adapter(dir.path());
  EXPECT_FALSE(c.options.target_regex);
  EXPECT_EQ(c.options.target_modules, std::vector<std::string>{"all-linear"});
}

// PEFT keeps an adapter-name infix in memory ("lora_A.default.weight"); files written from a
// state dict taken at that point carry it.
TEST(AdapterIo, AcceptsTheDefaultAdapterNameInfix) {
  TempDir dir;
  const Adapter a = sample_adapter();
  write_adapter(dir.path(), a);
  model::NamedTensors tensors;
  for (const auto& w : a.weights) {
    tensors.emplace_back("base_model.model." + w.module + ".lora_A.default.weight", w.A);
    tensors.emplace_back("base_model.model." + w.module + ".lora_B.default.weight", w.B);
  }
  model::write_safetensors(dir / kAdapterWeightsFile, tensors, torch::kBFloat16);
  const Adapter b = read_adapter(dir.path());
  ASSERT_EQ(b.weights.size(), 4u);
  EXPECT_EQ(b.weights[0].module, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(b.weights[0].A.scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(torch::equal(b.weights[0].A, a.weights[0].A.to(torch::kBFloat16)));
}

TEST(AdapterIo, UnsupportedOrBrokenAdaptersAreInputErrors) {
  TempDir dir;
  const Adapter a = sample_adapter();
  write_adapter(dir.path(), a);
  const auto cfg = dir / kAdapterConfigFile;
  const json good = read_json(cfg);
  auto with = [&](const char* key, json v) {
    json j = good;
    j[key] = std::move(v);
    fs::write_file_atomic(cfg, j.dump());
  };
  with("bias", "all");
  expect_error([&] { read_adapter(dir.path()); }, ErrorKind::kInput, {"bias", "none"});
  with("use_dora", true);
  expect_error([&] { read_adapter(dir.path()); }, ErrorKind::kInput, {"use_dora"});
  with("peft_type", "IA3");
  expect_error([&] { read_adapter(dir.path()); }, ErrorKind::kInput, {"peft_type"});
  fs::write_file_atomic(cfg, good.dump());

  model::write_safetensors(
      dir / kAdapterWeightsFile,
      {{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", a.weights[0].A}});
  expect_error([&] { read_adapter(dir.path()); }, ErrorKind::kInput,
               {"model.layers.0.self_attn.q_proj has lora_A but not lora_B"});
  model::write_safetensors(dir / kAdapterWeightsFile, {{"lm_head.weight", a.weights[0].A}});
  expect_error([&] { read_adapter(dir.path()); }, ErrorKind::kInput,
               {"lm_head.weight is not a LoRA weight"});
  std::filesystem::remove(dir / kAdapterWeightsFile);
  expect_error([&] { read_adapter(dir.path()); }, ErrorKind::kInput,
               {"adapter_model.safetensors is missing"});
}

// PEFT writes every LoraConfig field; those that change which modules are adapted or what the
// adapter computes must be unset, or the run would silently differ from PEFT's model.
TEST(AdapterIo, PeftSettingsThatChangeTheModelAreRefusedAndTheirDefaultsAccepted) {
  TempDir dir;
  write_adapter(dir.path(), sample_adapter());
  const auto cfg = dir / kAdapterConfigFile;
  json good = read_json(cfg);
  // What PEFT 0.21 writes for a plain adapter.
  good["exclude_modules"] = nullptr;
  good["layers_to_transform"] = nullptr;
  good["lora_bias"] = false;
  good["use_qalora"] = false;
  good["qalora_group_size"] = 16;
  good["loftq_config"] = json::object();
  good["trainable_token_indices"] = nullptr;
  good["target_parameters"] = nullptr;
  good["init_lora_weights"] = "orthogonal";
  fs::write_file_atomic(cfg, good.dump());
  EXPECT_EQ(read_adapter(dir.path()).weights.size(), 4u);
  const std::vector<std::pair<const char*, json>> refused = {
      {"exclude_modules", json({"v_proj"})},
      {"layers_to_transform", json({0})},
      {"layer_replication", json({{0, 2}})},
      {"lora_bias", true},
      {"trainable_token_indices", json({1, 2})},
      {"alora_invocation_tokens", json({5})},
      {"use_qalora", true},
      {"init_lora_weights", "pissa"},
      {"init_lora_weights", "loftq"}};
  for (const auto& [key, value] : refused) {
    json j = good;
    j[key] = value;
    fs::write_file_atomic(cfg, j.dump());
    expect_error([&] { read_adapter(dir.path()); }, ErrorKind::kInput,
                 {std::string("adapter_config.json"), std::string(key)});
  }
}

TEST(AdapterIo, LoadingIntoAModelChecksModulesAndShapes) {
  const Adapter a = sample_adapter();
  auto m = small_model();
  LoraModel lora(m, small_options(), "k");
  lora.load(a.weights, "adapter");
  EXPECT_TRUE(torch::equal(lora.weights()[2].B, a.weights[2].B));
  std::vector<LoraWeights> missing(a.weights.begin() + 1, a.weights.end());
  expect_error([&] { lora.load(missing, "adapter"); }, ErrorKind::kInput,
               {"adapter", "no weights for module model.layers.0.self_attn.q_proj"});
  auto m2 = small_model();
  LoraModel fewer(m2, small_options({"q_proj"}), "k");
  expect_error([&] { fewer.load(a.weights, "adapter"); }, ErrorKind::kInput, {"does not adapt"});
}

}  // namespace
}  // namespace dstrain::lora::testing
