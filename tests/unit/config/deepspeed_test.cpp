// DeepSpeed configs accepted as they are: a `deepspeed:` section, a JSON file named by
// `zero.config` or by `deepspeed: <path>`, the key mapping, "auto", ignored keys and conflicts.

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "config_test_util.h"
#include "core/error.h"

namespace dstrain::config {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::load_error;
using testing::minimal_yaml;
using testing::TempDir;

TEST(DeepSpeedConfig, SeedDsConfigJsonLoadsThroughZeroConfig) {
  const std::string json = testing::seed_dir() + "/ds_config.json";
  if (!std::filesystem::exists(json)) GTEST_SKIP() << "seed config not found at " << json;
  TempDir dir;
  const std::string yaml = dir.write("train.yaml", minimal_yaml("zero:\n  config: " + json + "\n"));
  const Config c = load_config(yaml);
  EXPECT_EQ(std::filesystem::weakly_canonical(c.zero.config),
            std::filesystem::weakly_canonical(json));
  EXPECT_EQ(c.training.per_device_train_batch_size, 1);
  EXPECT_EQ(c.training.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.training.optimizer.type, "adamw");
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 5e-5);
  EXPECT_DOUBLE_EQ(c.training.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.training.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.training.optimizer.weight_decay, 0.1);
  EXPECT_EQ(c.training.scheduler.type, "WarmupCosineLR");
  EXPECT_DOUBLE_EQ(c.training.scheduler.warmup_min_ratio, 0.0);
  EXPECT_EQ(c.training.scheduler.warmup_steps, 10);
  EXPECT_DOUBLE_EQ(c.training.scheduler.cos_min_ratio, 0.0);  // written as cosine_min_ratio
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer.device, "cpu");
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_TRUE(c.training.bf16);
}

TEST(DeepSpeedConfig, RelativeJsonPathIsResolvedAgainstTheYamlDirectory) {
  TempDir dir;
  std::filesystem::create_directories(dir.path() / "conf");
  dir.write("conf/ds.json", R"({"zero_optimization": {"stage": 1}, "gradient_clipping": 0.5})");
  const Config a =
      load_config(dir.write("conf/a.yaml", minimal_yaml("zero:\n  config: ds.json\n")));
  EXPECT_EQ(a.zero.stage, 1);
  EXPECT_DOUBLE_EQ(a.training.gradient_clipping, 0.5);
  EXPECT_EQ(a.zero.config, (dir.path() / "conf/ds.json").string());
  // The dump records where the DeepSpeed keys came from and loads back on its own.
  const std::string dumped = to_yaml(a);
  EXPECT_THAT(dumped, HasSubstr("# DeepSpeed settings merged from " + a.zero.config));
  EXPECT_EQ(load_config_from_string(dumped, "dumped.yaml"), a);
  // `deepspeed:` may also be a path.
  const Config b = load_config(dir.write("conf/b.yaml", minimal_yaml("deepspeed: ds.json\n")));
  EXPECT_EQ(b.zero.stage, 1);
}

TEST(DeepSpeedConfig, MissingJsonFileNamesTheKeyAndPath) {
  TempDir dir;
  const std::string yaml = dir.write("t.yaml", minimal_yaml("zero:\n  config: nope.json\n"));
  try {
    load_config(yaml);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_THAT(e.what(), HasSubstr(yaml + ":6:11: zero.config: cannot read"));
    EXPECT_THAT(e.what(), HasSubstr("nope.json"));
  }
}

TEST(DeepSpeedConfig, JsonErrorsCarryLineAndColumn) {
  TempDir dir;
  const std::string json =
      dir.write("ds.json", "{\n  \"zero_optimization\": {\n    \"stage\": 7\n  }\n}\n");
  const std::string yaml = dir.write("t.yaml", minimal_yaml("deepspeed: ds.json\n"));
  try {
    load_config(yaml);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              json + ":3:14: zero_optimization.stage: expected an integer in 0..3, got \"7\"");
  }
}

TEST(DeepSpeedConfig, SequenceParallelSizeMapsOntoTheParallelSection) {
  LoadOptions options;
  options.world_size = 4;
  const Config c = load_config_from_string(
      testing::minimal_yaml("deepspeed:\n  sequence_parallel_size: 4\n"), "m", options);
  EXPECT_EQ(c.parallel.sequence_parallel_size, 4);
}

TEST(DeepSpeedConfig, KeysMapOntoOurSettings) {
  const Config c = load_config_from_string(minimal_yaml(R"(deepspeed:
  train_micro_batch_size_per_gpu: 2
  gradient_accumulation_steps: 4
  optimizer:
    type: SGD
    params: {lr: 0.01, momentum: 0.9, weight_decay: 0.01}
  scheduler:
    type: WarmupDecayLR
    params: {warmup_min_lr: 0.0001, warmup_max_lr: 0.01, warmup_num_steps: 5, warmup_type: linear, total_num_steps: 100}
  fp16: {enabled: true, loss_scale: 0, initial_scale_power: 12, loss_scale_window: 500, hysteresis: 3, min_loss_scale: 0.5}
  gradient_clipping: 2.0
  wall_clock_breakdown: true
  steps_per_print: 7
  zero_optimization:
    stage: 3
    offload_param: {device: cpu, pin_memory: true}
    stage3_gather_16bit_weights_on_model_save: true
    stage3_max_reuse_distance: 1e8
)"),
                                           "m.yaml");
  const TrainingSection& t = c.training;
  EXPECT_EQ(t.per_device_train_batch_size, 2);
  EXPECT_EQ(t.gradient_accumulation_steps, 4);
  EXPECT_EQ(t.optimizer.type, "sgd");
  EXPECT_DOUBLE_EQ(t.optimizer.lr, 0.01);
  EXPECT_DOUBLE_EQ(t.optimizer.momentum, 0.9);
  EXPECT_DOUBLE_EQ(t.optimizer.weight_decay, 0.01);
  EXPECT_EQ(t.scheduler.type, "WarmupDecayLR");
  EXPECT_DOUBLE_EQ(t.scheduler.warmup_min_lr, 0.0001);
  EXPECT_DOUBLE_EQ(t.scheduler.warmup_max_lr, 0.01);
  EXPECT_EQ(t.scheduler.warmup_steps, 5);
  EXPECT_EQ(t.scheduler.warmup_type, "linear");
  EXPECT_EQ(t.scheduler.total_num_steps, 100);
  EXPECT_TRUE(t.fp16);
  EXPECT_DOUBLE_EQ(t.fp16_loss_scale, 0);
  EXPECT_DOUBLE_EQ(t.fp16_initial_scale_power, 12);
  EXPECT_EQ(t.fp16_loss_scale_window, 500);
  EXPECT_EQ(t.fp16_hysteresis, 3);
  EXPECT_DOUBLE_EQ(t.fp16_min_loss_scale, 0.5);
  EXPECT_DOUBLE_EQ(t.gradient_clipping, 2.0);
  EXPECT_EQ(t.log_interval, 7);
  EXPECT_TRUE(c.logging.wall_clock_breakdown);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_param.device, "cpu");
  EXPECT_TRUE(c.zero.offload_param.pin_memory);
  EXPECT_TRUE(c.zero.stage3_gather_16bit_weights_on_model_save);
  EXPECT_EQ(c.zero.stage3_max_reuse_distance, 100'000'000);
}

TEST(DeepSpeedConfig, BothCosMinRatioSpellingsAreAccepted) {
  for (const char* key : {"cos_min_ratio", "cosine_min_ratio"}) {
    const Config c = load_config_from_string(
        minimal_yaml(std::string("deepspeed:\n  scheduler:\n    type: WarmupCosineLR\n    params:\n"
                                 "      ") +
                     key + ": 0.25\n"),
        "m.yaml");
    EXPECT_DOUBLE_EQ(c.training.scheduler.cos_min_ratio, 0.25) << key;
  }
}

TEST(DeepSpeedConfig, AdamIsAdamWAndOtherOptimizersAreRejected) {
  EXPECT_EQ(load_config_from_string(minimal_yaml("deepspeed:\n  optimizer: {type: Adam}\n"), "m")
                .training.optimizer.type,
            "adamw");
  EXPECT_THAT(load_error(minimal_yaml("deepspeed:\n  optimizer: {type: Lamb}\n")),
              HasSubstr("deepspeed.optimizer.type: expected AdamW, Adam or SGD, got \"Lamb\""));
  EXPECT_THAT(load_error(minimal_yaml(
                  "deepspeed:\n  optimizer: {type: Adam, params: {adam_w_mode: false}}\n")),
              HasSubstr("deepspeed.optimizer.params.adam_w_mode: expected true"));
  EXPECT_THAT(load_error(minimal_yaml("deepspeed:\n  scheduler: {type: OneCycle}\n")),
              HasSubstr("deepspeed.scheduler.type: expected WarmupLR, WarmupDecayLR or "
                        "WarmupCosineLR"));
}

TEST(DeepSpeedConfig, AutoTakesTheValueFromOurSections) {
  const Config c = load_config_from_string(minimal_yaml(R"(training:
  lr: 0.003
  per_device_train_batch_size: 4
  bf16: true
deepspeed:
  train_micro_batch_size_per_gpu: auto
  train_batch_size: auto
  gradient_accumulation_steps: auto
  optimizer: {type: AdamW, params: {lr: auto, betas: auto, eps: auto, weight_decay: auto}}
  scheduler: {type: WarmupLR, params: {warmup_max_lr: auto, warmup_num_steps: auto}}
  bf16: {enabled: auto}
  fp16: {enabled: auto}
  zero_optimization: {stage: 2, reduce_bucket_size: auto}
)"),
                                           "m.yaml");
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 0.003);
  EXPECT_EQ(c.training.per_device_train_batch_size, 4);
  EXPECT_EQ(c.training.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.training.train_batch_size, -1);
  EXPECT_TRUE(c.training.bf16);
  EXPECT_FALSE(c.training.fp16);
  EXPECT_EQ(c.training.scheduler.warmup_max_lr, -1);
  EXPECT_EQ(c.zero.reduce_bucket_size, ZeroSection().reduce_bucket_size);
  EXPECT_EQ(c.zero.stage, 2);
}

TEST(DeepSpeedConfig, UnusedDeepSpeedKeysWarnOnce) {
  std::vector<std::string> warnings;
  LoadOptions options;
  options.warnings = &warnings;
  const Config c = load_config_from_string(minimal_yaml(R"(deepspeed:
  flops_profiler: {enabled: true, profile_step: 1}
  zero_allow_untested_optimizer: true
  activation_checkpointing: {partition_activations: true}
  comms_logger: {enabled: false}
  zero_optimization: {stage: 1, sub_group_size: 1e9}
)"),
                                           "m.yaml", options);
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_THAT(warnings,
              ElementsAre(HasSubstr("m.yaml:6:19: deepspeed.flops_profiler: ignored"),
                          HasSubstr("deepspeed.zero_allow_untested_optimizer: ignored"),
                          HasSubstr("deepspeed.activation_checkpointing.partition_activations: "
                                    "ignored (activation checkpointing is switched by "
                                    "model.gradient_checkpointing"),
                          HasSubstr("deepspeed.comms_logger: ignored"),
                          HasSubstr("deepspeed.zero_optimization.sub_group_size: ignored")));
}

// DeepSpeed's activation_checkpointing keys load (each notes what dstrain does instead), do not
// turn checkpointing on by themselves (neither does DeepSpeed's), and a misspelt one is an error.
TEST(DeepSpeedConfig, ActivationCheckpointingKeysAreRecognised) {
  std::vector<std::string> warnings;
  LoadOptions options;
  options.warnings = &warnings;
  const Config c = load_config_from_string(minimal_yaml(R"(training:
  gradient_checkpointing: true
deepspeed:
  activation_checkpointing:
    partition_activations: true
    cpu_checkpointing: false
    contiguous_memory_optimization: false
    number_checkpoints: null
    synchronize_checkpoint_boundary: false
    profile: false
)"),
                                           "m.yaml", options);
  EXPECT_EQ(c.model.gradient_checkpointing, "true");
  ASSERT_EQ(warnings.size(), 6u);
  EXPECT_THAT(warnings[1], HasSubstr("deepspeed.activation_checkpointing.cpu_checkpointing: "
                                     "ignored (activation checkpointing is switched by "
                                     "model.gradient_checkpointing"));
  EXPECT_EQ(load_config_from_string(
                minimal_yaml("deepspeed:\n  activation_checkpointing: {profile: true}\n"), "m")
                .model.gradient_checkpointing,
            "false");
  EXPECT_THAT(
      load_error(
          minimal_yaml("deepspeed:\n  activation_checkpointing: {partition_activation: 1}\n")),
      HasSubstr("deepspeed.activation_checkpointing.partition_activation: unknown key; did you "
                "mean deepspeed.activation_checkpointing.partition_activations?"));
}

// DeepSpeed keys dstrain stores but does not act on load, keep their value, and warn once each
// with what dstrain does instead; the same for our own zero section's spelling.
TEST(DeepSpeedConfig, StoredKeysWithoutEffectWarnAndSayWhy) {
  std::vector<std::string> warnings;
  LoadOptions options;
  options.warnings = &warnings;
  const Config c = load_config_from_string(minimal_yaml(R"(deepspeed:
  zero_optimization:
    stage: 2
    allgather_bucket_size: 2.0e8
    reduce_bucket_size: 2.0e8
    offload_optimizer: {device: cpu, pin_memory: true}
    stage3_gather_16bit_weights_on_model_save: true
)"),
                                           "m.yaml", options);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200'000'000);
  ASSERT_EQ(warnings.size(), 3u);
  EXPECT_THAT(warnings[0], HasSubstr("zero_optimization.allgather_bucket_size: accepted, no "
                                     "effect in dstrain (stages 1-2 all-gather"));
  EXPECT_THAT(warnings[1], HasSubstr("offload_optimizer.pin_memory: accepted, no effect"));
  EXPECT_THAT(warnings[2], HasSubstr("stage3_gather_16bit_weights_on_model_save: accepted"));
  warnings.clear();
  load_config_from_string(minimal_yaml("zero:\n  stage3_max_live_parameters: 1000\n"), "m.yaml",
                          options);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr("zero.stage3_max_live_parameters: accepted, no effect"));
}

TEST(DeepSpeedConfig, UnknownDeepSpeedKeyIsAnErrorWithSuggestion) {
  EXPECT_THAT(load_error(minimal_yaml("deepspeed:\n  gradient_clip: 1.0\n")),
              HasSubstr("train.yaml:6:3: deepspeed.gradient_clip: unknown key; did you mean "
                        "deepspeed.gradient_clipping?"));
  EXPECT_THAT(load_error(minimal_yaml("deepspeed:\n  zero_optimization: {stgae: 2}\n")),
              HasSubstr("deepspeed.zero_optimization.stgae: unknown key; did you mean "
                        "deepspeed.zero_optimization.stage?"));
}

TEST(DeepSpeedConfig, EqualValuesInBothPlacesAreFine) {
  const Config c = load_config_from_string(
      minimal_yaml("training:\n  lr: 2.0e-5\n  bf16: true\n  gradient_accumulation_steps: 8\n"
                   "deepspeed:\n  optimizer: {type: AdamW, params: {lr: 2e-05}}\n"
                   "  bf16: {enabled: true}\n  gradient_accumulation_steps: 8\n"),
      "m.yaml");
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 2e-5);
}

TEST(DeepSpeedConfig, DifferentValuesInBothPlacesNameBothLocations) {
  const std::string yaml = minimal_yaml(
      "training:\n  lr: 2.0e-5\ndeepspeed:\n  optimizer:\n    params:\n      lr: 3.0e-5\n");
  EXPECT_EQ(load_error(yaml),
            "train.yaml:10:11: deepspeed.optimizer.params.lr: 3e-05 conflicts with training.lr = "
            "2e-05 at train.yaml:6:7");
}

TEST(DeepSpeedConfig, ConflictBetweenYamlAndJsonFileNamesBoth) {
  TempDir dir;
  const std::string json = dir.write("ds.json", "{\n  \"zero_optimization\": {\"stage\": 2}\n}\n");
  const std::string yaml =
      dir.write("t.yaml", minimal_yaml("zero:\n  stage: 3\n  config: ds.json\n"));
  try {
    load_config(yaml);
    FAIL() << "expected a conflict";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), json +
                                         ":2:34: zero_optimization.stage: 2 conflicts with "
                                         "zero.stage = 3 at " +
                                         yaml + ":6:10");
  }
}

}  // namespace
}  // namespace dstrain::config
