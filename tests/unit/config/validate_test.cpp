// Cross-field rules: the DeepSpeed batch-size triple and combinations that cannot work together.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "config_test_util.h"

namespace dstrain::config {
namespace {

using ::testing::HasSubstr;
using testing::load_error;
using testing::minimal_yaml;
using testing::world;

TEST(ConfigValidate, TrainBatchSizeMustEqualMicroTimesAccumulationTimesWorld) {
  const std::string yaml = minimal_yaml(
      "deepspeed:\n  train_batch_size: 64\n  train_micro_batch_size_per_gpu: 2\n"
      "  gradient_accumulation_steps: 8\n");
  EXPECT_EQ(load_config_from_string(yaml, "m", world(4)).training.train_batch_size, 64);
  EXPECT_EQ(load_error(yaml, world(2)),
            "train.yaml:6:21: deepspeed.train_batch_size: 64 != per_device_train_batch_size (2) * "
            "gradient_accumulation_steps (8) * world size (2) = 32");
}

TEST(ConfigValidate, AnyTwoBatchTermsDetermineTheThird) {
  const Config a = load_config_from_string(
      minimal_yaml("deepspeed:\n  train_batch_size: 64\n  train_micro_batch_size_per_gpu: 2\n"),
      "m", world(4));
  EXPECT_EQ(a.training.gradient_accumulation_steps, 8);
  const Config b = load_config_from_string(
      minimal_yaml("training:\n  gradient_accumulation_steps: 4\n  train_batch_size: 32\n"), "m",
      world(2));
  EXPECT_EQ(b.training.per_device_train_batch_size, 4);
  const Config c =
      load_config_from_string(minimal_yaml("deepspeed:\n  train_batch_size: 16\n"), "m", world(8));
  EXPECT_EQ(c.training.per_device_train_batch_size, 2);
  EXPECT_EQ(c.training.gradient_accumulation_steps, 1);
  EXPECT_THAT(load_error(minimal_yaml("deepspeed:\n  train_batch_size: 10\n"
                                      "  train_micro_batch_size_per_gpu: 4\n"),
                         world(1)),
              HasSubstr("deepspeed.train_batch_size: 10 is not divisible by "
                        "per_device_train_batch_size (4) * world size (1) = 4"));
}

TEST(ConfigValidate, SequenceParallelSizeDividesTheWorldAndTheLength) {
  EXPECT_EQ(load_config_from_string(minimal_yaml("parallel:\n  sequence_parallel_size: 2\n"), "m",
                                    world(4))
                .parallel.sequence_parallel_size,
            2);
  EXPECT_EQ(load_error(minimal_yaml("parallel:\n  sequence_parallel_size: 2\n"), world(3)),
            "train.yaml:6:27: parallel.sequence_parallel_size: the world size (3) is not divisible "
            "by sequence_parallel_size (2): world = data-parallel degree x "
            "sequence_parallel_size");
  EXPECT_THAT(load_error(minimal_yaml("  max_length: 30\nparallel:\n  sequence_parallel_size: 4\n"),
                         world(4)),
              HasSubstr("parallel.sequence_parallel_size: data.max_length (30, data.max_length at "
                        "train.yaml:5:15) is not divisible by sequence_parallel_size (4)"));
}

// DeepSpeed's rule counts data-parallel ranks: a sequence-parallel group reads one micro batch.
TEST(ConfigValidate, BatchRuleCountsDataParallelRanks) {
  const Config c = load_config_from_string(
      minimal_yaml("parallel:\n  sequence_parallel_size: 2\ndeepspeed:\n  train_batch_size: 8\n"
                   "  train_micro_batch_size_per_gpu: 2\n"),
      "m", world(4));
  EXPECT_EQ(c.training.gradient_accumulation_steps, 2);
  EXPECT_THAT(load_error(minimal_yaml("parallel:\n  sequence_parallel_size: 2\ndeepspeed:\n"
                                      "  train_batch_size: 8\n  train_micro_batch_size_per_gpu: 2\n"
                                      "  gradient_accumulation_steps: 4\n"),
                         world(4)),
              HasSubstr("8 != per_device_train_batch_size (2) * gradient_accumulation_steps (4) * "
                        "data-parallel size (2 = world size 4 / sequence_parallel_size 2) = 16"));
}

TEST(ConfigValidate, Bf16AndFp16CannotBothBeOn) {
  EXPECT_THAT(load_error(minimal_yaml("training:\n  bf16: true\n  fp16: true\n")),
              HasSubstr("train.yaml:7:9: training.fp16: fp16 and bf16 cannot both be enabled "
                        "(bf16 is set by training.bf16 at train.yaml:6:9)"));
}

TEST(ConfigValidate, OffloadNeedsTheRightZeroStage) {
  EXPECT_THAT(load_error(minimal_yaml("zero:\n  offload_optimizer: {device: cpu}\n")),
              HasSubstr("zero.offload_optimizer.device: offloading the optimizer needs ZeRO stage "
                        "1, 2 or 3, but the stage is 0"));
  EXPECT_THAT(load_error(minimal_yaml("zero:\n  stage: 2\n  offload_param:\n    device: cpu\n")),
              HasSubstr("train.yaml:8:13: zero.offload_param.device: offloading parameters needs "
                        "ZeRO stage 3, but the stage is 2 (zero.stage at train.yaml:6:10)"));
  EXPECT_EQ(load_config_from_string(
                minimal_yaml("zero:\n  stage: 3\n  offload_param: {device: cpu}\n"), "m")
                .zero.offload_param.device,
            "cpu");
  EXPECT_THAT(load_error(minimal_yaml("zero:\n  stage: 3\n  offload_param: {device: nvme}\n")),
              HasSubstr("zero.offload_param.device: expected one of none, cpu, got \"nvme\""));
}

TEST(ConfigValidate, OtherCrossFieldRules) {
  EXPECT_THAT(load_error(minimal_yaml("data:\n  eval_path: e\n  eval_split: 0.1\n")),
              HasSubstr("data.eval_split: eval_split carves evaluation data"));
  EXPECT_THAT(load_error(minimal_yaml("training:\n  momentum: 0.9\n")),
              HasSubstr("training.momentum: momentum applies to the sgd optimizer only"));
  EXPECT_THAT(load_error(minimal_yaml("training:\n  warmup_min_lr: 0.1\n  warmup_max_lr: 0.01\n")),
              HasSubstr("training.warmup_min_lr: warmup_min_lr (0.1) is above warmup_max_lr"));
  EXPECT_THAT(load_error(minimal_yaml(), world(0)), HasSubstr("world size must be at least 1"));
}

}  // namespace
}  // namespace dstrain::config
