// Loading our own YAML: the seed config as it is, defaults, types, positions in errors, unknown
// keys with suggestions, and file handling.

#include <filesystem>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "config/merge.h"
#include "config/rules.h"
#include "config_test_util.h"
#include "core/error.h"
#include "core/text.h"

namespace dstrain::config {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::load_error;
using testing::minimal_yaml;
using ::testing::Not;
using testing::TempDir;
using testing::world;

TEST(ConfigLoad, SeedTrainYamlLoadsWithItsValues) {
  const std::string path = testing::seed_dir() + "/train.yaml";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "seed config not found at " << path;
  const Config c = load_config(path);
  EXPECT_EQ(c.source_path, path);
  EXPECT_EQ(c.model.name_or_path, "Qwen/Qwen2.5-0.5B");
  EXPECT_EQ(c.data.train_path, "data/03_primary/train.parquet");
  EXPECT_EQ(c.data.eval_path, "data/03_primary/valid.parquet");
  EXPECT_EQ(c.data.text_field, "text");
  EXPECT_EQ(c.data.max_length, 1024);
  EXPECT_EQ(c.training.epochs, 3);
  EXPECT_EQ(c.training.per_device_train_batch_size, 1);
  EXPECT_EQ(c.training.gradient_accumulation_steps, 8);
  EXPECT_DOUBLE_EQ(c.training.optimizer.lr, 2.0e-5);
  EXPECT_EQ(c.training.optimizer.type, "adamw");
  EXPECT_DOUBLE_EQ(c.training.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.training.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.training.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.training.optimizer.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c.training.scheduler.warmup_ratio, 0.03);
  EXPECT_EQ(c.training.seed, 42u);
  EXPECT_TRUE(c.training.bf16);
  EXPECT_FALSE(c.training.fp16);
  EXPECT_DOUBLE_EQ(c.training.gradient_clipping, 1.0);
  EXPECT_FALSE(c.model.use_flash_attn);
  EXPECT_EQ(c.data.num_workers, 4);
  EXPECT_EQ(c.data.num_workers_eval, 2);
  EXPECT_TRUE(c.lora.enabled);
  EXPECT_EQ(c.lora.r, 16);
  EXPECT_DOUBLE_EQ(c.lora.alpha, 32);
  EXPECT_DOUBLE_EQ(c.lora.dropout, 0.05);
  EXPECT_EQ(c.lora.target_modules,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj"}));
  EXPECT_EQ(c.logging.out_dir, "data/05_model/run_yaml");
  EXPECT_EQ(c.logging.metrics_path, "data/05_model/run_yaml/metrics.json");
  EXPECT_FALSE(c.logging.wall_clock_breakdown);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_optimizer.device, "none");
  EXPECT_EQ(c.zero.offload_param.device, "none");
  EXPECT_TRUE(c.zero.overlap_comm);
  EXPECT_TRUE(c.zero.contiguous_gradients);
  EXPECT_EQ(c.zero.reduce_bucket_size, 50'000'000);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50'000'000);
  EXPECT_EQ(c.zero.stage3_param_persistence_threshold, 100'000);
}

TEST(ConfigLoad, MinimalConfigGetsDefaults) {
  const Config c = load_config_from_string(minimal_yaml(), "mem.yaml");
  Config expected;
  expected.model.name_or_path = "tiny";
  expected.data.train_path = "train.txt";
  EXPECT_EQ(c, expected);
  EXPECT_FALSE(c.lora.enabled);
  EXPECT_EQ(c.source_path, "");
}

TEST(ConfigLoad, AllSectionsAndExtraKeysAreRead) {
  const Config c = load_config_from_string(minimal_yaml(R"(training:
  max_steps: 100
  eval_interval: 25
  optimizer: SGD
  momentum: 0.9
  lr_scheduler: linear
  warmup_steps: 10
  min_lr_ratio: 0.1
  betas: [0.8, 0.9]
checkpoint:
  dir: ck
  interval: 50
  keep_last: 2
logging:
  tensorboard_dir: tb
zero:
  stage: 2
  offload_optimizer: {device: cpu, pin_memory: true}
  allgather_bucket_size: 2.0e8
)"),
                                           "mem.yaml");
  EXPECT_EQ(c.training.max_steps, 100);
  EXPECT_EQ(c.training.eval_interval, 25);
  EXPECT_EQ(c.training.optimizer.type, "sgd");
  EXPECT_DOUBLE_EQ(c.training.optimizer.momentum, 0.9);
  EXPECT_EQ(c.training.scheduler.type, "linear");
  EXPECT_EQ(c.training.scheduler.warmup_steps, 10);
  EXPECT_DOUBLE_EQ(c.training.scheduler.min_lr_ratio, 0.1);
  EXPECT_DOUBLE_EQ(c.training.optimizer.beta1, 0.8);
  EXPECT_EQ(c.checkpoint.dir, "ck");
  EXPECT_EQ(c.checkpoint.interval, 50);
  EXPECT_EQ(c.checkpoint.keep_last, 2);
  EXPECT_EQ(c.logging.tensorboard_dir, "tb");
  EXPECT_EQ(c.zero.stage, 2);
  EXPECT_EQ(c.zero.offload_optimizer.device, "cpu");
  EXPECT_TRUE(c.zero.offload_optimizer.pin_memory);
  EXPECT_EQ(c.zero.allgather_bucket_size, 200'000'000);
}

TEST(ConfigLoad, AliasesLandOnTheSameSetting) {
  const Config c = load_config_from_string(R"(model:
  name_or_path: m
  use_flash_attn: true
data:
  train_path: t
  num_workers: 3
lora:
  lora_alpha: 8
  lora_dropout: 0.1
)",
                                           "mem.yaml");
  EXPECT_TRUE(c.model.use_flash_attn);
  EXPECT_DOUBLE_EQ(c.lora.alpha, 8);
  EXPECT_DOUBLE_EQ(c.lora.dropout, 0.1);
  EXPECT_EQ(c.data.num_workers, 3);
  // Two spellings of one setting must agree.
  EXPECT_THAT(load_error(R"(model:
  name_or_path: m
  use_flash_attn: true
data:
  train_path: t
training:
  use_flash_attn: false
)"),
              HasSubstr("train.yaml:7:19: training.use_flash_attn: false conflicts with "
                        "model.use_flash_attn = true at train.yaml:3:19"));
}

// HF puts gradient_checkpointing in TrainingArguments; both places set the one switch.
TEST(ConfigLoad, GradientCheckpointingIsSwitchedFromModelOrTraining) {
  EXPECT_EQ(load_config_from_string(minimal_yaml(), "m").model.gradient_checkpointing, "false");
  EXPECT_EQ(
      load_config_from_string(minimal_yaml("training:\n  gradient_checkpointing: true\n"), "m")
          .model.gradient_checkpointing,
      "true");
  const Config c = load_config_from_string(R"(model:
  name_or_path: m
  gradient_checkpointing: true
data:
  train_path: t
)",
                                           "m");
  EXPECT_EQ(c.model.gradient_checkpointing, "true");
  LoadOptions o;
  o.overrides = {"training.gradient_checkpointing=true"};
  EXPECT_EQ(load_config_from_string(minimal_yaml(), "m", o).model.gradient_checkpointing, "true");
}

// true | false | offload, under either name; offload writes back as offload, a bool as a bool.
TEST(ConfigLoad, GradientCheckpointingTakesOffload) {
  const Config off = load_config_from_string(minimal_yaml(), "m");
  EXPECT_EQ(off.model.gradient_checkpointing, "false");
  const Config c = load_config_from_string(
      minimal_yaml("training:\n  activation_checkpointing: offload\n"), "m");
  EXPECT_EQ(c.model.gradient_checkpointing, "offload");
  EXPECT_THAT(to_yaml(c), HasSubstr("gradient_checkpointing: \"offload\""));
  LoadOptions o;
  o.overrides = {"model.gradient_checkpointing=true"};
  const Config on = load_config_from_string(minimal_yaml(), "m", o);
  EXPECT_EQ(on.model.gradient_checkpointing, "true");
  EXPECT_THAT(to_yaml(on), HasSubstr("gradient_checkpointing: true"));
  EXPECT_THAT(load_error(minimal_yaml("training:\n  activation_checkpointing: cpu\n")),
              HasSubstr("train.yaml:6:29: training.activation_checkpointing: expected true, false, "
                        "offload, selective or auto, got \"cpu\""));
}

// auto: no setting is fixed in the config (the run plan chooses, train/run_plan.h)
// and the config keeps the word, so a resumed run chooses again; a word that is not one of the
// four is an error naming the key and the allowed values.
TEST(ConfigLoad, GradientCheckpointingTakesAutoAndKeepsIt) {
  const Config c =
      load_config_from_string(minimal_yaml("training:\n  gradient_checkpointing: AUTO\n"), "m");
  EXPECT_EQ(c.model.gradient_checkpointing, "auto");
  const std::string yaml = to_yaml(c);
  EXPECT_THAT(yaml, HasSubstr("gradient_checkpointing: \"auto\""));
  const Config again = load_config_from_string(yaml, "m");
  EXPECT_EQ(again.model.gradient_checkpointing, "auto");
  EXPECT_TRUE(again.model == c.model);
  LoadOptions o;
  o.overrides = {"model.gradient_checkpointing=offload"};
  const Config offload =
      load_config_from_string(minimal_yaml("training:\n  gradient_checkpointing: auto\n"), "m", o);
  EXPECT_EQ(offload.model.gradient_checkpointing, "offload") << "a later source replaces auto";
  EXPECT_FALSE(offload.model == c.model);
  o.overrides = {"model.gradient_checkpointing=autox"};
  EXPECT_THAT(load_error(minimal_yaml(), o),
              HasSubstr("model.gradient_checkpointing: expected true, false, offload, selective or "
                        "auto, got \"autox\""));
}

// selective (attention kept, model/selective_attention.h), in any case, writes back as selective
// and reads back equal; a later source's bool replaces it.
TEST(ConfigLoad, GradientCheckpointingTakesSelective) {
  const Config c = load_config_from_string(
      minimal_yaml("training:\n  gradient_checkpointing: Selective\n"), "m");
  EXPECT_EQ(c.model.gradient_checkpointing, "selective");
  const std::string yaml = to_yaml(c);
  EXPECT_THAT(yaml, HasSubstr("gradient_checkpointing: \"selective\""));
  EXPECT_TRUE(load_config_from_string(yaml, "m").model == c.model);
  LoadOptions o;
  o.overrides = {"model.gradient_checkpointing=true"};
  const Config plain = load_config_from_string(
      minimal_yaml("training:\n  gradient_checkpointing: selective\n"), "m", o);
  EXPECT_EQ(plain.model.gradient_checkpointing, "true");
  EXPECT_FALSE(plain.model == c.model);
  o.overrides = {"model.gradient_checkpointing=selectiv"};
  EXPECT_THAT(load_error(minimal_yaml(), o),
              HasSubstr("model.gradient_checkpointing: expected true, false, offload, selective or "
                        "auto, got \"selectiv\""));
}

TEST(ConfigLoad, TiledMlpIsOffAutoOrTokensPerTile) {
  EXPECT_EQ(load_config_from_string(minimal_yaml(), "m").model.tiled_mlp, 0);
  auto with = [](const std::string& v) {
    LoadOptions o;
    o.overrides = {"model.tiled_mlp=" + v};
    return o;
  };
  auto tiled = [&](const std::string& v) {
    return load_config_from_string(minimal_yaml(), "m", with(v)).model.tiled_mlp;
  };
  EXPECT_EQ(tiled("auto"), -1);
  EXPECT_EQ(tiled("off"), 0);
  EXPECT_EQ(tiled("2048"), 2048);
  EXPECT_EQ(tiled("4.0e3"), 4000);
  const Config c = load_config_from_string(minimal_yaml(), "m", with("auto"));
  EXPECT_THAT(to_yaml(c), HasSubstr("tiled_mlp: \"auto\""));
  for (const std::string bad : {"0", "-5", "fast", "1.5"}) {
    EXPECT_THAT(load_error(minimal_yaml(), with(bad)),
                HasSubstr("model.tiled_mlp: expected off, auto or a positive number of tokens per "
                          "tile, got \"" +
                          bad + "\""));
  }
}

TEST(ConfigLoad, LoraSectionEnablesLora) {
  EXPECT_TRUE(load_config_from_string(minimal_yaml("lora:\n  r: 4\n"), "m").lora.enabled);
  EXPECT_TRUE(load_config_from_string(minimal_yaml("lora:\n"), "m").lora.enabled);
  EXPECT_FALSE(
      load_config_from_string(minimal_yaml("lora:\n  enabled: false\n  r: 4\n"), "m").lora.enabled);
}

TEST(ConfigLoad, IntegralFloatNotationIsAnInteger) {
  const Config c = load_config_from_string(
      minimal_yaml("zero:\n  reduce_bucket_size: 5.0e7\n  stage3_max_live_parameters: 1e9\n"), "m");
  EXPECT_EQ(c.zero.reduce_bucket_size, 50'000'000);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1'000'000'000);
  EXPECT_THAT(load_error(minimal_yaml("zero:\n  reduce_bucket_size: 5.5\n")),
              HasSubstr("zero.reduce_bucket_size: expected a positive integer, got \"5.5\""));
}

TEST(ConfigLoad, TypeErrorNamesFileLineColumnKeyAndExpectation) {
  const std::string yaml = minimal_yaml("training:\n  lr: fast\n");
  EXPECT_EQ(load_error(yaml),
            "train.yaml:6:7: training.lr: expected a positive number, got \"fast\"");
}

TEST(ConfigLoad, RangeAndChoiceErrors) {
  EXPECT_THAT(load_error(minimal_yaml("training:\n  lr: -1\n")),
              HasSubstr("train.yaml:6:7: training.lr: expected a positive number, got \"-1\""));
  EXPECT_THAT(load_error(minimal_yaml("zero:\n  stage: 4\n")),
              HasSubstr("train.yaml:6:10: zero.stage: expected an integer in 0..3"));
  EXPECT_THAT(load_error(minimal_yaml("data:\n  max_length: 0\n")),
              HasSubstr("data.max_length: expected a positive integer"));
  EXPECT_THAT(load_error(minimal_yaml("data:\n  eval_split: 1.0\n")),
              HasSubstr("data.eval_split: expected a number in [0, 1)"));
  EXPECT_THAT(load_error(minimal_yaml("lora:\n  r: 0\n")),
              HasSubstr("lora.r: expected a positive integer"));
  EXPECT_THAT(load_error(minimal_yaml("training:\n  bf16: maybe\n")),
              HasSubstr("training.bf16: expected true or false, got \"maybe\""));
  EXPECT_THAT(load_error(minimal_yaml("training:\n  optimizer: lion\n")),
              HasSubstr("training.optimizer: expected one of adamw, sgd, got \"lion\""));
  EXPECT_THAT(load_error(minimal_yaml("training:\n  betas: [0.9]\n")),
              HasSubstr("training.betas: expected a list of two numbers in [0, 1), got a list"));
  EXPECT_THAT(load_error(minimal_yaml("training: 3\n")),
              HasSubstr("train.yaml:5:11: training: expected a mapping of settings, got \"3\""));
}

TEST(ConfigLoad, ATrainerArgumentNameIsAnsweredWithTheDstrainKey) {
  EXPECT_EQ(load_error(minimal_yaml("training:\n  save_steps: 500\n")),
            "train.yaml:6:3: training.save_steps: unknown key; the Hugging Face Trainer's "
            "save_steps is checkpoint.interval in dstrain (docs/migrating.md)");
  // Under any section, as users paste them.
  EXPECT_THAT(load_error(minimal_yaml("logging:\n  logging_steps: 10\n")),
              HasSubstr("logging.logging_steps: unknown key; the Hugging Face Trainer's "
                        "logging_steps is training.log_interval in dstrain"));
  EXPECT_THAT(load_error(minimal_yaml("training:\n  learning_rate: 0.1\n")),
              HasSubstr("is training.lr in dstrain"));
}

TEST(ConfigLoad, EveryTrainerArgumentNamesAKeyThatExists) {
  const config::detail::RuleSet& rules = config::detail::our_rules();
  for (const auto& [name, target] : config::detail::trainer_argument_keys()) {
    for (const auto& [path, rule] : rules.leaves) {
      EXPECT_FALSE(path == name || ends_with(path, "." + name)) << name << " is " << path;
    }
    if (target.find('`') == 0) continue;  // a command, not a key
    const std::string key = target.substr(0, target.find_first_of(": "));
    EXPECT_NE(rules.leaf(key), nullptr) << name << " -> " << key;
  }
}

// Pipeline parallelism under dstrain's names, Megatron-LM's (pipeline_model_parallel_size,
// virtual_pipeline_model_parallel_size) and DeepSpeed's pipeline.stages; each setting it cannot
// run with refused naming its key.
TEST(ConfigLoad, PipelineParallelUnderEachNameAndWhatItRefuses) {
  TempDir dir;
  const std::string megatron = dir.write(
      "megatron.yaml", minimal_yaml("training:\n  gradient_accumulation_steps: 4\nparallel:\n  "
                                    "pipeline_model_parallel_size: 2\n  "
                                    "virtual_pipeline_model_parallel_size: 2\n"));
  Config c = load_config(megatron, world(4));
  EXPECT_EQ(c.parallel.pipeline_parallel_size, 2);
  EXPECT_EQ(c.parallel.pipeline_virtual_stages, 2);
  EXPECT_EQ(c.parallel.data_parallel(4), 2);
  dir.write("ds.json", R"({"pipeline": {"stages": 4, "partition": "parameters"}})");
  std::vector<std::string> warnings;
  LoadOptions options = world(4);
  options.warnings = &warnings;
  c = load_config(dir.write("ds.yaml", minimal_yaml("deepspeed: ds.json\n")), options);
  EXPECT_EQ(c.parallel.pipeline_parallel_size, 4);
  EXPECT_THAT(::testing::PrintToString(warnings), HasSubstr("pipeline.partition"));
  EXPECT_THAT(::testing::PrintToString(warnings), HasSubstr("idles 75% of a step"))
      << "one micro-batch through four stages";
  c = load_config(dir.write("split.yaml", minimal_yaml("parallel:\n  pipeline_parallel_size: 2\n  "
                                                       "pipeline_split: [1, 3]\n")),
                  world(2));
  EXPECT_EQ(c.parallel.pipeline_split, (std::vector<std::string>{"1", "3"}));

  const auto pipeline = [](const std::string& more) {
    return minimal_yaml("parallel:\n  pipeline_parallel_size: 2\n" + more);
  };
  EXPECT_THAT(load_error(pipeline(""), world(3)),
              HasSubstr("parallel.pipeline_parallel_size: the world size (3) is not divisible by "
                        "pipeline_parallel_size (2)"));
  EXPECT_THAT(load_error(pipeline("zero:\n  stage: 3\n"), world(2)),
              HasSubstr("runs with ZeRO stage 0, 1 or 2, not 3"));
  // Sequence parallelism inside each stage loads.
  EXPECT_EQ(load_config(dir.write("sp.yaml", pipeline("  sequence_parallel_size: 2\n")), world(4))
                .parallel.sequence_parallel_size,
            2);
  // The micro-batch auto plans every stage (run_plan.h); interleaving needs the micro-batches a
  // multiple of the stages, which the choice does not keep to.
  EXPECT_TRUE(load_config(dir.write("auto.yaml",
                                    pipeline("training:\n  per_device_train_batch_size: auto\n")),
                          world(2))
                  .training.micro_batch_auto);
  EXPECT_THAT(load_error(pipeline("  pipeline_virtual_stages: 2\ntraining:\n  "
                                  "per_device_train_batch_size: auto\n"),
                         world(2)),
              HasSubstr("training.per_device_train_batch_size: auto is not available with the "
                        "interleaved pipeline schedule"));
  EXPECT_THAT(
      load_error(pipeline("  pipeline_virtual_stages: 2\n  pipeline_schedule: gpipe\n"), world(2)),
      HasSubstr("run only the 1F1B schedule"));
  EXPECT_THAT(load_error(pipeline("  pipeline_schedule: interleaved_1f1b\n"), world(2)),
              HasSubstr("interleaved_1f1b needs parallel.pipeline_virtual_stages of 2 or more"));
  EXPECT_THAT(load_error(pipeline("  pipeline_schedule: zigzag\n"), world(2)),
              HasSubstr("parallel.pipeline_schedule"));
  EXPECT_THAT(load_error(pipeline("  pipeline_split: [4]\n"), world(2)),
              HasSubstr("1 layer counts for 2 stage(s)"));
  EXPECT_THAT(load_error(pipeline("  pipeline_split: [2, x]\n"), world(2)),
              HasSubstr("parallel.pipeline_split: expected a list of layer counts of 1 or "
                        "more, one per stage"));
  EXPECT_THAT(load_error(pipeline("  pipeline_virtual_stages: 2\ntraining:\n  "
                                  "gradient_accumulation_steps: 3\n"),
                         world(2)),
              HasSubstr("training.gradient_accumulation_steps: 3 is not a multiple of "
                        "pipeline_parallel_size (2)"));
}

// Tensor parallelism under dstrain's name, Megatron-LM's (tensor_model_parallel_size, and
// sequence_parallel for its sequence parallelism) and DeepSpeed's AutoTP size; two names that
// disagree are refused naming both.
TEST(ConfigLoad, TensorParallelSizeUnderEachName) {
  TempDir dir;
  for (const char* key : {"tensor_parallel_size", "tensor_model_parallel_size"}) {
    const std::string path = dir.write(
        std::string(key) + ".yaml",
        minimal_yaml("parallel:\n  " + std::string(key) + ": 2\n  sequence_parallel: false\n"));
    const Config c = load_config(path, world(2));
    EXPECT_EQ(c.parallel.tensor_parallel_size, 2) << key;
    EXPECT_FALSE(c.parallel.tensor_sequence_parallel) << key;
  }
  dir.write("ds.json", R"({"tensor_parallel": {"autotp_size": 2}})");
  EXPECT_EQ(load_config(dir.write("ds.yaml", minimal_yaml("deepspeed: ds.json\n")), world(2))
                .parallel.tensor_parallel_size,
            2);
  const std::string error = load_error(
      minimal_yaml("parallel:\n  tensor_parallel_size: 2\n  tensor_model_parallel_size: 4\n"),
      world(4));
  EXPECT_THAT(error, HasSubstr("tensor_model_parallel_size"));
  EXPECT_THAT(error, HasSubstr("conflicts with"));
  EXPECT_THAT(load_error(minimal_yaml("parallel:\n  tensor_parallel_size: 2\n"), world(3)),
              HasSubstr("the world size (3) is not divisible by sequence_parallel_size (1) x "
                        "tensor_parallel_size (2)"));
}

// Megatron-LM's batch and recomputation names where they mean dstrain's settings: the global and
// micro batch under the batch rule, `full` recomputation; its `selective` (the core attention
// alone) is refused naming the key. Expert parallelism under Megatron-LM's name.
TEST(ConfigLoad, MegatronNamesOfBatchRecomputationAndExperts) {
  TempDir dir;
  const Config c = load_config(
      dir.write("m.yaml",
                minimal_yaml("training:\n  global_batch_size: 16\n  micro_batch_size: 2\n"
                             "  gradient_accumulation_steps: 4\n  recompute_granularity: full\n"
                             "parallel:\n  expert_model_parallel_size: 2\n")),
      world(2));
  EXPECT_EQ(c.training.train_batch_size, 16);
  EXPECT_EQ(c.training.per_device_train_batch_size, 2);
  EXPECT_EQ(c.model.gradient_checkpointing, "true");
  EXPECT_EQ(c.parallel.expert_parallel_size, 2);
  const std::string error =
      load_error(minimal_yaml("training:\n  recompute_granularity: selective\n"), world(1));
  EXPECT_THAT(error, HasSubstr("training.recompute_granularity"));
  EXPECT_THAT(error, HasSubstr("has no equivalent"));
  EXPECT_THAT(load_error(minimal_yaml("parallel:\n  expert_parallel_size: 3\n"), world(4)),
              HasSubstr("parallel.expert_parallel_size"));
}

// lr_scheduler: constant_with_warmup loads; a warmup key beside constant warns that it has no
// effect.
TEST(ConfigLoad, ConstantScheduleWarmupKeysWarnAndConstantWithWarmupLoads) {
  std::vector<std::string> warnings;
  LoadOptions options;
  options.warnings = &warnings;
  Config c = load_config_from_string(
      minimal_yaml("training:\n  lr_scheduler: constant\n  warmup_steps: 10\n"), "m.yaml", options);
  EXPECT_EQ(c.training.scheduler.type, "constant");
  EXPECT_THAT(warnings, ElementsAre(HasSubstr("training.warmup_steps: accepted, no effect: "
                                              "lr_scheduler constant has no warmup")));
  warnings.clear();
  c = load_config_from_string(
      minimal_yaml("training:\n  lr_scheduler: constant_with_warmup\n  warmup_steps: 10\n"),
      "m.yaml", options);
  EXPECT_EQ(c.training.scheduler.type, "constant_with_warmup");
  EXPECT_TRUE(warnings.empty());
}

TEST(ConfigLoad, UnknownKeySuggestsTheClosestKey) {
  EXPECT_EQ(load_error(minimal_yaml("training:\n  lrr: 0.1\n")),
            "train.yaml:6:3: training.lrr: unknown key; did you mean training.lr?");
  EXPECT_THAT(load_error(minimal_yaml("trainig:\n  lr: 0.1\n")),
              HasSubstr("train.yaml:5:1: trainig: unknown key; did you mean training?"));
  // The right name in the wrong section points at the right section.
  EXPECT_THAT(load_error(minimal_yaml("training:\n  max_length: 64\n")),
              HasSubstr("training.max_length: unknown key; did you mean data.max_length?"));
  // A DeepSpeed key at the top level points at the deepspeed section.
  EXPECT_THAT(
      load_error(minimal_yaml("zero_optimization:\n  stage: 2\n")),
      HasSubstr("zero_optimization: unknown key; did you mean deepspeed.zero_optimization?"));
  EXPECT_THAT(load_error(minimal_yaml("training:\n  zzzzzz: 1\n")),
              HasSubstr("training.zzzzzz: unknown key; expected one of: "));
}

TEST(ConfigLoad, RequiredKeysAreReported) {
  EXPECT_EQ(load_error("data:\n  train_path: t\n"),
            "train.yaml: model.name_or_path: required: expected a model directory or a Hugging "
            "Face hub id");
  EXPECT_THAT(load_error("model:\n  name_or_path: m\n"),
              HasSubstr("train.yaml: data.train_path: required"));
}

TEST(ConfigLoad, InvalidYamlSyntaxHasAPosition) {
  EXPECT_THAT(load_error("model: [unclosed\n"), HasSubstr("train.yaml:"));
  EXPECT_THAT(load_error("model: [unclosed\n"), HasSubstr("invalid YAML"));
  EXPECT_THAT(load_error("- a\n- b\n"), HasSubstr("train.yaml: expected a mapping of sections"));
}

TEST(ConfigLoad, FileIsReadAndUnreadableFileIsAConfigError) {
  TempDir dir;
  const std::string path = dir.write("t.yaml", minimal_yaml("training:\n  epochs: 2\n"));
  EXPECT_EQ(load_config(path).training.epochs, 2);
  const std::string missing = (dir.path() / "missing.yaml").string();
  try {
    load_config(missing);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_THAT(e.what(), HasSubstr(missing));
  }
}

}  // namespace
}  // namespace dstrain::config
