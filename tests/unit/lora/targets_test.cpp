// Target module selection follows PEFT: names match dotted-path suffixes, a single regex must match
// the whole path, and names that select nothing are clear config errors.
#include <gtest/gtest.h>

#include "lora/targets.h"
#include "tests/unit/lora/lora_test_util.h"

namespace dstrain::lora::testing {
namespace {

std::vector<std::string> paths(const std::vector<TargetModule>& t) {
  std::vector<std::string> out;
  for (const auto& m : t) out.push_back(m.path);
  return out;
}

TEST(LoraTargets, NamesMatchModulePathSuffixesInEveryLayer) {
  auto m = small_model();
  const auto t = resolve_targets(*m, {"v_proj", "q_proj"}, false, "k");
  EXPECT_EQ(paths(t), (std::vector<std::string>{
                          "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.v_proj",
                          "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.v_proj"}));
  EXPECT_EQ(t[0].in_features, 64);
  EXPECT_EQ(t[0].out_features, 64);  // 4 heads × 16
  EXPECT_EQ(t[1].out_features, 32);  // 2 kv heads × 16
  EXPECT_EQ(
      paths(resolve_targets(*m, {"mlp.down_proj"}, false, "k")),
      (std::vector<std::string>{"model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"}));
  EXPECT_EQ(resolve_targets(*m, {"model.layers.1.mlp.up_proj"}, false, "k").size(), 1u);
  // A suffix must start at a dot: "proj" is not the name of any module.
  expect_error([&] { resolve_targets(*m, {"proj"}, false, "k"); }, ErrorKind::kConfig, {"'proj'"});
}

TEST(LoraTargets, SingleRegexMustMatchTheWholePath) {
  EXPECT_TRUE(is_regex_target({R"(.*\.(q|v)_proj)"}));
  EXPECT_FALSE(is_regex_target({"q_proj"}));
  EXPECT_FALSE(is_regex_target({"self_attn.q_proj"}));
  EXPECT_FALSE(is_regex_target({"q_proj", "(v|k)_proj"}));
  auto m = small_model();
  const auto t = resolve_targets(*m, {R"(model\.layers\.1\.self_attn\.(q|v)_proj)"}, true, "k");
  EXPECT_EQ(paths(t), (std::vector<std::string>{"model.layers.1.self_attn.q_proj",
                                                "model.layers.1.self_attn.v_proj"}));
  EXPECT_EQ(resolve_targets(*m, {R"(.*_proj)"}, true, "k").size(), 14u);
  // re.fullmatch semantics: a bare name matches no full path.
  expect_error([&] { resolve_targets(*m, {"q_pro."}, true, "k"); }, ErrorKind::kConfig,
               {"matches no module"});
  expect_error([&] { resolve_targets(*m, {"(q_proj"}, true, "k"); }, ErrorKind::kConfig,
               {"not a valid regular expression"});
}

// PEFT's "all-linear": every linear layer but lm_head, written out as the names it expanded to.
TEST(LoraTargets, AllLinearSelectsEveryProjectionAndExpandsToTheirNames) {
  const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                          "gate_proj", "up_proj", "down_proj"};
  auto m = small_model();
  EXPECT_TRUE(is_all_linear({"all-linear"}));
  EXPECT_FALSE(is_regex_target({"all-linear"}));
  EXPECT_EQ(resolve_targets(*m, {"all-linear"}, false, "k").size(), 14u);
  EXPECT_EQ(expand_all_linear(*m, {"all-linear"}), names);
  EXPECT_EQ(expand_all_linear(*m, {"q_proj"}), std::vector<std::string>{"q_proj"});
  LoraModel lora(m, small_options({"all-linear"}), "k");
  EXPECT_EQ(lora.options().target_modules, names);
  EXPECT_EQ(lora.modules().size(), 14u);
}

TEST(LoraTargets, UnknownNameIsConfigErrorListingTargetableModules) {
  auto m = small_model();
  expect_error(
      [&] {
        resolve_targets(*m, {"q_proj", "query_key_value"}, false, "run.yaml: lora.target_modules");
      },
      ErrorKind::kConfig,
      {"run.yaml: lora.target_modules", "'query_key_value' matches no module",
       "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"});
}

TEST(LoraTargets, ModuleThatIsNotAProjectionIsConfigError) {
  auto m = small_model();  // untied: has lm_head
  expect_error([&] { resolve_targets(*m, {"lm_head"}, false, "k"); }, ErrorKind::kConfig,
               {"'lm_head' selects module lm_head, which cannot carry a LoRA adapter"});
  expect_error([&] { resolve_targets(*m, {"input_layernorm"}, false, "k"); }, ErrorKind::kConfig,
               {"cannot carry"});
  expect_error([&] { resolve_targets(*m, {"self_attn"}, false, "k"); }, ErrorKind::kConfig,
               {"model.layers.0.self_attn, which cannot carry"});
}

}  // namespace
}  // namespace dstrain::lora::testing
