// training.per_device_train_batch_size: auto in the config: the samples per rank it keeps (from
// train_batch_size or the user's own split, a DeepSpeed micro-batch included), its errors, how a
// resolved config writes it, and the hint for a DeepSpeed micro-batch of 1.

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

TEST(ConfigMicroBatchAuto, HoldsMicroBatchOneTimesTheSamplesPerRank) {
  const Config c =
      load_config_from_string(minimal_yaml("training:\n  per_device_train_batch_size: auto\n"
                                           "  gradient_accumulation_steps: 8\n"),
                              "m", world(2));
  EXPECT_TRUE(c.training.micro_batch_auto);
  EXPECT_FALSE(c.training.micro_batch_chosen);
  EXPECT_EQ(c.training.per_device_train_batch_size, 1);
  EXPECT_EQ(c.training.gradient_accumulation_steps, 8);
}

TEST(ConfigMicroBatchAuto, TrainBatchSizeGivesTheSamplesPerDataParallelRank) {
  const Config c = load_config_from_string(
      minimal_yaml("training:\n  per_device_train_batch_size: AUTO\n  train_batch_size: 64\n"), "m",
      world(4));
  EXPECT_EQ(c.training.gradient_accumulation_steps, 16);
  EXPECT_EQ(c.training.train_batch_size, 64);
  // With sequence parallelism a group of ranks shares a sample: 4 ranks are 2 data-parallel ones.
  const Config sp = load_config_from_string(
      minimal_yaml("training:\n  per_device_train_batch_size: auto\n  train_batch_size: 64\n"
                   "parallel:\n  sequence_parallel_size: 2\n"),
      "m", world(4));
  EXPECT_EQ(sp.training.gradient_accumulation_steps, 32);
}

TEST(ConfigMicroBatchAuto, OverridesADeepSpeedMicroBatchKeepingItsGlobalBatch) {
  const std::string yaml = minimal_yaml(
      "training:\n  per_device_train_batch_size: auto\n"
      "deepspeed:\n  train_micro_batch_size_per_gpu: 2\n  gradient_accumulation_steps: 4\n");
  const Config c = load_config_from_string(yaml, "m", world(2));
  EXPECT_TRUE(c.training.micro_batch_auto);
  EXPECT_EQ(c.training.per_device_train_batch_size, 1);
  EXPECT_EQ(c.training.gradient_accumulation_steps, 8);  // 2 x 4 samples per rank
  // All three DeepSpeed terms given: they must still multiply out.
  const std::string triple = minimal_yaml(
      "training:\n  per_device_train_batch_size: auto\n"
      "deepspeed:\n  train_batch_size: 32\n  train_micro_batch_size_per_gpu: 2\n"
      "  gradient_accumulation_steps: 4\n");
  EXPECT_EQ(load_config_from_string(triple, "m", world(4)).training.gradient_accumulation_steps, 8);
  EXPECT_THAT(load_error(triple, world(2)),
              HasSubstr("deepspeed.train_batch_size: 32 != "
                        "deepspeed.train_micro_batch_size_per_gpu (2) * "
                        "gradient_accumulation_steps (4) * world size (2) = 16"));
}

TEST(ConfigMicroBatchAuto, SetAutoKeepsTheFilesSplitAndASetNumberReplacesAuto) {
  const std::string yaml = minimal_yaml(
      "training:\n  per_device_train_batch_size: 4\n  gradient_accumulation_steps: 2\n");
  LoadOptions to_auto = world(1);
  to_auto.overrides = {"training.per_device_train_batch_size=auto"};
  const Config a = load_config_from_string(yaml, "m", to_auto);
  EXPECT_TRUE(a.training.micro_batch_auto);
  EXPECT_EQ(a.training.gradient_accumulation_steps, 8);
  LoadOptions to_number = world(1);
  to_number.overrides = {"training.per_device_train_batch_size=3"};
  const Config n = load_config_from_string(
      minimal_yaml("training:\n  per_device_train_batch_size: auto\n"), "m", to_number);
  EXPECT_FALSE(n.training.micro_batch_auto);
  EXPECT_EQ(n.training.per_device_train_batch_size, 3);
}

TEST(ConfigMicroBatchAuto, ANumberInEitherPlaceIsUsedAsItIs) {
  const Config ds = load_config_from_string(
      minimal_yaml("deepspeed:\n  train_micro_batch_size_per_gpu: 4\n"), "m", world(1));
  EXPECT_FALSE(ds.training.micro_batch_auto);
  EXPECT_EQ(ds.training.per_device_train_batch_size, 4);
  // DeepSpeed's own "auto" means "from our sections", not micro-batch auto.
  const Config deferred =
      load_config_from_string(minimal_yaml("training:\n  per_device_train_batch_size: 2\n"
                                           "deepspeed:\n  train_micro_batch_size_per_gpu: auto\n"),
                              "m", world(1));
  EXPECT_FALSE(deferred.training.micro_batch_auto);
  EXPECT_EQ(deferred.training.per_device_train_batch_size, 2);
}

TEST(ConfigMicroBatchAuto, BadValuesNameTheKeyAndWhatWasExpected) {
  EXPECT_EQ(load_error(minimal_yaml("training:\n  per_device_train_batch_size: autox\n")),
            "train.yaml:6:32: training.per_device_train_batch_size: expected a positive integer or "
            "auto, got \"autox\"");
  EXPECT_THAT(load_error(minimal_yaml("training:\n  per_device_train_batch_size: 0\n")),
              HasSubstr("training.per_device_train_batch_size: expected a positive integer or "
                        "auto, got \"0\""));
  EXPECT_EQ(load_error(minimal_yaml("training:\n  per_device_train_batch_size: auto\n"
                                    "  train_batch_size: 10\n"),
                       world(4)),
            "train.yaml:7:21: training.train_batch_size: 10 is not divisible by world size (4): "
            "per_device_train_batch_size: auto (training.per_device_train_batch_size at "
            "train.yaml:6:32) needs a whole number of samples per rank");
}

TEST(ConfigMicroBatchAuto, AResolvedConfigWritesAutoTheSamplesAndTheChoice) {
  Config c = load_config_from_string(minimal_yaml("training:\n  per_device_train_batch_size: auto\n"
                                                  "  gradient_accumulation_steps: 8\n"),
                                     "m", world(1));
  EXPECT_THAT(to_yaml(c), HasSubstr("per_device_train_batch_size: \"auto\"\n"));
  EXPECT_EQ(load_config_from_string(to_yaml(c), "record", world(1)), c);
  // The trainer's choice (train/micro_batch_auto.h): written as a comment, the samples kept.
  c.training.per_device_train_batch_size = 4;
  c.training.gradient_accumulation_steps = 2;
  c.training.micro_batch_chosen = true;
  const std::string record = to_yaml(c);
  EXPECT_THAT(record, HasSubstr("per_device_train_batch_size: \"auto\"  # chosen: micro-batch 4 x "
                                "accumulation 2\n"));
  EXPECT_THAT(record, HasSubstr("gradient_accumulation_steps: 8\n"));
  const Config back = load_config_from_string(record, "record", world(1));
  EXPECT_TRUE(back.training.micro_batch_auto);
  EXPECT_EQ(back.training.per_device_train_batch_size, 1);
  EXPECT_EQ(back.training.gradient_accumulation_steps, 8);
}

std::vector<std::string> notes_of(const std::string& yaml) {
  std::vector<std::string> notes;
  LoadOptions options;
  options.warnings = &notes;
  load_config_from_string(yaml, "train.yaml", options);
  return notes;
}

TEST(ConfigMicroBatchAuto, DeepSpeedMicroBatchOneWithAccumulationGetsAHintNamingAuto) {
  const auto notes =
      notes_of(minimal_yaml("deepspeed:\n  train_micro_batch_size_per_gpu: 1\n"
                            "  gradient_accumulation_steps: 8\n"));
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_THAT(notes[0], HasSubstr("train.yaml:6:35: deepspeed.train_micro_batch_size_per_gpu: "
                                  "hint: micro-batch 1 with gradient accumulation 8"));
  EXPECT_THAT(notes[0], HasSubstr("training.per_device_train_batch_size: auto"));
  // No hint without accumulation, for our own section's number, or once auto is set.
  EXPECT_TRUE(notes_of(minimal_yaml("deepspeed:\n  train_micro_batch_size_per_gpu: 1\n")).empty());
  EXPECT_TRUE(notes_of(minimal_yaml("training:\n  per_device_train_batch_size: 1\n"
                                    "  gradient_accumulation_steps: 8\n"))
                  .empty());
  EXPECT_TRUE(notes_of(minimal_yaml("training:\n  per_device_train_batch_size: auto\n"
                                    "deepspeed:\n  train_micro_batch_size_per_gpu: 1\n"
                                    "  gradient_accumulation_steps: 8\n"))
                  .empty());
}

}  // namespace
}  // namespace dstrain::config
