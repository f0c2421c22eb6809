// to_yaml writes the whole resolved config in our key names and loads back to an equal config.

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "config_test_util.h"

namespace dstrain::config {
namespace {

using ::testing::HasSubstr;
using testing::minimal_yaml;

// Every setting moved off its default, so a key missing from to_yaml would be noticed.
const char* kEverything = R"(model:
  name_or_path: "org/model: v2"
  init: random
  dtype: bfloat16
  tokenizer: byte
  gradient_checkpointing: offload
  tiled_mlp: 1536
data:
  train_path: a.jsonl
  format: jsonl
  text_field: body
  document: line
  max_length: 77
  packing: false
  add_bos: true
  eval_split: 0.25
  shuffle: false
  drop_last: false
training:
  epochs: 5
  max_steps: 123
  per_device_train_batch_size: 3
  per_device_eval_batch_size: 6
  gradient_accumulation_steps: 2
  train_batch_size: 12
  seed: 7
  eval_interval: 10
  eval_max_batches: 4
  log_interval: 5
  use_flash_attn: true
  cuda_graphs: "off"
  num_workers: 2
  num_workers_eval: 0
  optimizer: sgd
  lr: 0.0123456789
  betas: [0.8, 0.95]
  eps: 1.0e-6
  weight_decay: 0.01
  momentum: 0.9
  gradient_clipping: 0.7
  lr_scheduler: WarmupCosineLR
  warmup_ratio: 0.1
  warmup_steps: 9
  min_lr_ratio: 0.05
  warmup_min_lr: 1.0e-7
  warmup_max_lr: 0.02
  warmup_type: linear
  total_num_steps: 999
  warmup_min_ratio: 0.01
  cos_min_ratio: 0.2
  bf16: false
  fp16: true
  fp16_loss_scale: 128
  fp16_initial_scale_power: 10
  fp16_loss_scale_window: 200
  fp16_hysteresis: 4
  fp16_min_loss_scale: 0.25
lora:
  r: 3
  alpha: 6.5
  dropout: 0.1
  target_modules: [gate_proj]
  bias: none
  use_rslora: true
  init: gaussian
  init_from: adapters/x
zero:
  stage: 3
  offload_optimizer: {device: cpu, pin_memory: true}
  offload_param: {device: cpu, pin_memory: true}
  overlap_comm: false
  contiguous_gradients: false
  reduce_bucket_size: 1000
  allgather_bucket_size: 2000
  stage3_prefetch_bucket_size: 3000
  stage3_param_persistence_threshold: 4000
  stage3_max_live_parameters: 5000
  stage3_max_reuse_distance: 6000
  stage3_gather_16bit_weights_on_model_save: true
logging:
  out_dir: "runs/#1"
  metrics_path: m.jsonl
  progress: false
  wall_clock_breakdown: true
  tensorboard_dir: tb
  mlflow_experiment: exp
checkpoint:
  dir: ck
  interval: 11
  keep_last: 3
  save_final: false
)";

TEST(ConfigRoundTrip, EverySettingSurvivesToYamlAndBack) {
  LoadOptions options;
  options.world_size = 2;
  const Config original = load_config_from_string(kEverything, "all.yaml", options);
  Config defaults;
  EXPECT_FALSE(original.model == defaults.model);
  EXPECT_FALSE(original.training == defaults.training);
  const std::string yaml = to_yaml(original);
  const Config again = load_config_from_string(yaml, "dumped.yaml", options);
  EXPECT_EQ(again, original) << yaml;
  EXPECT_EQ(to_yaml(again), yaml);
}

TEST(ConfigRoundTrip, DefaultsAreWrittenOutInOurKeyNames) {
  const Config c = load_config_from_string(minimal_yaml(), "m.yaml");
  const std::string yaml = to_yaml(c);
  EXPECT_THAT(yaml, HasSubstr("  lr: 0.0001\n"));
  EXPECT_THAT(yaml, HasSubstr("  betas: [0.9, 0.999]\n"));
  EXPECT_THAT(yaml, HasSubstr("  train_batch_size: auto\n"));
  EXPECT_THAT(yaml, HasSubstr("  reduce_bucket_size: 50000000\n"));
  EXPECT_THAT(yaml, HasSubstr("  target_modules: [\"q_proj\", \"v_proj\"]\n"));
  EXPECT_THAT(yaml, HasSubstr("lora:\n  enabled: false\n"));
  EXPECT_THAT(yaml, HasSubstr("  offload_optimizer:\n    device: \"none\"\n"));
  EXPECT_EQ(load_config_from_string(yaml, "again.yaml"), c);
}

TEST(ConfigRoundTrip, SeedConfigSurvivesToYamlAndBack) {
  const std::string path = testing::seed_dir() + "/train.yaml";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "seed config not found at " << path;
  const Config c = load_config(path);
  const Config again = load_config_from_string(to_yaml(c), "dumped.yaml");
  EXPECT_EQ(again, c);
  EXPECT_TRUE(again.lora.enabled);
}

TEST(ConfigRoundTrip, EqualityNoticesAChangedSetting) {
  Config a;
  Config b;
  EXPECT_EQ(a, b);
  b.zero.stage3_max_reuse_distance = 1;
  EXPECT_NE(a, b);
  b = a;
  b.zero.config = "ds.json";  // provenance, not a setting
  EXPECT_EQ(a, b);
}

TEST(ConfigRoundTrip, AResolvedConfigLoadsAgainWithoutWarnings) {
  std::vector<std::string> warnings;
  LoadOptions options;
  options.warnings = &warnings;
  const Config c = load_config_from_string(minimal_yaml(), "m.yaml", options);
  ASSERT_TRUE(warnings.empty());
  const Config again = load_config_from_string(to_yaml(c), "resolved.yaml", options);
  EXPECT_TRUE(warnings.empty()) << warnings.front();
  EXPECT_EQ(again, c);
}

}  // namespace
}  // namespace dstrain::config
