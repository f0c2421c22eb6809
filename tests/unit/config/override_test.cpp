// `--set key.path=value` overrides: YAML values, DeepSpeed paths, precedence, and errors that name
// the override.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "config_test_util.h"

namespace dstrain::config {
namespace {

using ::testing::HasSubstr;
using testing::load_error;
using testing::minimal_yaml;

LoadOptions with_overrides(std::vector<std::string> overrides) {
  LoadOptions options;
  options.overrides = std::move(overrides);
  return options;
}

TEST(ConfigOverride, ValuesAreParsedAsYaml) {
  const Config c = load_config_from_string(
      minimal_yaml(), "m.yaml",
      with_overrides({"training.lr=3e-4", "lora.target_modules=[q_proj, k_proj]", "zero.stage=2",
                      "zero.offload_optimizer.device=cpu", "logging.out_dir=runs/x"}));
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 3e-4);
  EXPECT_EQ(c.lora.target_modules, (std::vector<std::string>{"q_proj", "k_proj"}));
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer.device, "cpu");
  EXPECT_EQ(c.logging.out_dir, "runs/x");
  EXPECT_FALSE(c.lora.enabled);  // only a `lora:` section in the file, or lora.enabled, enables it
}

TEST(ConfigOverride, OverridesWinOverFileAndDeepSpeedAndApplyInOrder) {
  const std::string yaml =
      minimal_yaml("training:\n  lr: 1.0e-5\ndeepspeed:\n  optimizer: {params: {lr: 1.0e-5}}\n");
  const Config c = load_config_from_string(
      yaml, "m.yaml", with_overrides({"training.lr=0.5", "deepspeed.optimizer.params.lr=0.25"}));
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 0.25);
  const Config d = load_config_from_string(
      yaml, "m.yaml", with_overrides({"training.lr=0.5", "training.lr=0.125"}));
  EXPECT_DOUBLE_EQ(d.training.optimizer.lr, 0.125);
}

TEST(ConfigOverride, OverrideIsAppliedBeforeValidation) {
  // The file alone is invalid (offload needs stage >= 1); the override makes it valid.
  const std::string yaml = minimal_yaml("zero:\n  offload_optimizer: {device: cpu}\n");
  EXPECT_THAT(load_error(yaml), HasSubstr("offloading the optimizer needs ZeRO stage"));
  EXPECT_EQ(load_config_from_string(yaml, "m", with_overrides({"zero.stage=1"})).zero.stage, 1);
  // A required key can come from an override.
  EXPECT_EQ(load_config_from_string("data: {train_path: t}\n", "m",
                                    with_overrides({"model.name_or_path=org/model"}))
                .model.name_or_path,
            "org/model");
}

TEST(ConfigOverride, UnknownKeyNamesTheOverride) {
  EXPECT_EQ(load_error(minimal_yaml(), with_overrides({"training.lrr=1"})),
            "--set training.lrr=1: training.lrr: unknown key; did you mean training.lr?");
  EXPECT_THAT(load_error(minimal_yaml(), with_overrides({"deepspeed.zero_optimization.stag=1"})),
              HasSubstr("--set deepspeed.zero_optimization.stag=1: "
                        "deepspeed.zero_optimization.stag: unknown key; did you mean "
                        "deepspeed.zero_optimization.stage?"));
}

TEST(ConfigOverride, BadValueNamesTheOverride) {
  EXPECT_EQ(load_error(minimal_yaml(), with_overrides({"training.lr=fast"})),
            "--set training.lr=fast: training.lr: expected a positive number, got \"fast\"");
}

TEST(ConfigOverride, MalformedOverrideIsAnError) {
  EXPECT_EQ(load_error(minimal_yaml(), with_overrides({"training.lr"})),
            "--set training.lr: expected key.path=value");
  EXPECT_THAT(load_error(minimal_yaml(), with_overrides({"=3"})),
              HasSubstr("expected key.path=value"));
  EXPECT_THAT(load_error(minimal_yaml(), with_overrides({"training..lr=3"})),
              HasSubstr("empty key name"));
  EXPECT_THAT(load_error(minimal_yaml(), with_overrides({"lora.target_modules=[a, b"})),
              HasSubstr("--set lora.target_modules=[a, b: the value is not valid YAML"));
}

}  // namespace
}  // namespace dstrain::config
