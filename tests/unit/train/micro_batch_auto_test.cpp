// per_device_train_batch_size: auto's choice (train/micro_batch_auto.h): the candidates keep the
// global batch exact, the largest that fits a limit is taken (memory or the global batch bounding
// it), and the prediction grows with the micro-batch as the memory model says.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "config/config.h"
#include "core/error.h"
#include "model/model_config.h"
#include "train/micro_batch_auto.h"
#include "zero/estimate.h"
#include "zero/estimate_activations.h"

namespace dstrain::train {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(MicroBatchAuto, CandidatesAreTheDivisorsOfTheSamplesPerRankLargestFirst) {
  EXPECT_THAT(divisors_descending(12), ElementsAre(12, 6, 4, 3, 2, 1));
  EXPECT_THAT(divisors_descending(7), ElementsAre(7, 1));
  EXPECT_THAT(divisors_descending(1), ElementsAre(1));
  // Every candidate keeps micro × accumulation × ranks the global batch.
  const int64_t ranks = 4, global = 96, samples = global / ranks;
  for (int64_t micro : divisors_descending(samples)) {
    config::TrainingSection t;
    t.micro_batch_auto = true;
    t.gradient_accumulation_steps = samples;
    apply_micro_batch(t, micro, ranks);
    EXPECT_EQ(t.per_device_train_batch_size * t.gradient_accumulation_steps * ranks, global);
    EXPECT_EQ(t.train_batch_size, global);  // recorded, so a resume elsewhere keeps it
    EXPECT_TRUE(t.micro_batch_chosen);
  }
}

TEST(MicroBatchAuto, TheGlobalBatchBoundsTheChoiceWhenMemoryIsAmple) {
  auto peak = [](int64_t micro) { return 10 * kGiB + micro * kGiB; };
  const MicroBatchPlan plan = plan_micro_batch(8, peak, 80 * kGiB);
  EXPECT_EQ(plan.micro, 8);
  EXPECT_EQ(plan.accumulation(), 1);
  EXPECT_TRUE(plan.fits);
  EXPECT_FALSE(plan.memory_bound());
  EXPECT_EQ(plan.peak, 18 * kGiB);
  EXPECT_EQ(describe_plan(plan, 1),
            "micro-batch auto: 8 × accumulation 1 = global 8, fits in 18.0 GiB of 80.0 GiB "
            "(predicted peak per rank)");
}

TEST(MicroBatchAuto, MemoryBoundsTheChoiceToTheLargestDivisorThatFits) {
  // 64 samples per rank at 1.5 GiB each over 10 GiB of states, 30 GiB: micro 13 would fit, but
  // only divisors keep the global batch, so 8 (22 GiB) is taken, not 16 (34 GiB).
  auto peak = [](int64_t micro) { return 10 * kGiB + micro * 3 * kGiB / 2; };
  const MicroBatchPlan plan = plan_micro_batch(64, peak, 30 * kGiB);
  EXPECT_EQ(plan.micro, 8);
  EXPECT_EQ(plan.accumulation(), 8);
  EXPECT_TRUE(plan.fits);
  EXPECT_TRUE(plan.memory_bound());
  EXPECT_EQ(plan.full_peak, 106 * kGiB);
  EXPECT_EQ(describe_plan(plan, 2),
            "micro-batch auto: 8 × accumulation 8 = global 128, fits in 22.0 GiB of 30.0 GiB "
            "(predicted peak per rank); bounded by memory: micro-batch 64 (no accumulation) "
            "would need 106.0 GiB");
}

TEST(MicroBatchAuto, NothingFittingTakesMicroBatchOneAndSaysSo) {
  auto peak = [](int64_t micro) { return 40 * kGiB + micro * kGiB; };
  const MicroBatchPlan plan = plan_micro_batch(6, peak, 30 * kGiB);
  EXPECT_EQ(plan.micro, 1);
  EXPECT_EQ(plan.accumulation(), 6);
  EXPECT_FALSE(plan.fits);
  EXPECT_THAT(describe_plan(plan, 1), HasSubstr("does not fit: 41.0 GiB of 30.0 GiB"));
}

TEST(MicroBatchAuto, AMicroBatchThatDoesNotDivideIsRefused) {
  config::TrainingSection t;
  t.micro_batch_auto = true;
  t.gradient_accumulation_steps = 6;
  EXPECT_THROW(apply_micro_batch(t, 4, 1), Error);
  EXPECT_EQ(t.per_device_train_batch_size, 1);
}

// The prediction is the memory model's: model states of the stage plus one micro-batch's
// activations, which grow linearly with it (every activation term is per token).
TEST(MicroBatchAuto, PredictedPeakIsStatesPlusTheMicroBatchsActivations) {
  const model::ModelConfig tiny = model::load_model_config(
      std::filesystem::path(DSTRAIN_SOURCE_DIR) / "configs/models/tiny/config.json");
  config::Config c;
  c.data.max_length = 64;
  c.zero.stage = 2;
  const int64_t p1 = predicted_peak(c, tiny, 2, /*cuda=*/false, 1);
  const int64_t p4 = predicted_peak(c, tiny, 2, /*cuda=*/false, 4);
  const int64_t states =
      zero::estimate_row(zero::estimate_input(c, tiny, 2), 2, false, false).device();
  c.training.per_device_train_batch_size = 4;
  const int64_t activations4 =
      zero::activation_row(zero::activation_input(c, tiny, false), zero::Checkpointing::kNone)
          .device;
  EXPECT_EQ(p4, states + activations4);
  EXPECT_GT(p4, p1);
  // Checkpointing keeps less per micro-batch, so the same limit admits a larger one.
  config::Config ckpt = c;
  ckpt.model.gradient_checkpointing = true;
  EXPECT_LT(predicted_peak(ckpt, tiny, 2, false, 4), p4);
}

// Both auto settings: the micro-batch is planned without checkpointing whenever micro-batch 1 fits
// without; else for the first setting (fastest first) under which some micro-batch fits, its
// largest — not micro-batch 1 without checkpointing that does not fit.
TEST(MicroBatchAuto, WithCheckpointingAutoTooTheFirstSettingThatFitsIsPlannedFor) {
  const model::ModelConfig tiny = model::load_model_config(
      std::filesystem::path(DSTRAIN_SOURCE_DIR) / "configs/models/tiny/config.json");
  config::Config c;
  c.data.max_length = 512;
  c.training.micro_batch_auto = true;
  c.training.gradient_accumulation_steps = 8;
  c.model.checkpoint_auto = true;
  const auto peak = [&](int64_t micro, zero::Checkpointing s) {
    return predicted_peak(c, tiny, 1, /*cuda=*/false, micro, s);
  };
  // Ample memory: no checkpointing, the whole batch.
  MicroBatchPlan plan = plan_for_run(c, tiny, 1, false, peak(8, zero::Checkpointing::kNone));
  EXPECT_EQ(plan.checkpointing, zero::Checkpointing::kNone);
  EXPECT_EQ(plan.micro, 8);
  // Micro-batch 1 fits without checkpointing: still none (the fastest), micro-batch 1.
  plan = plan_for_run(c, tiny, 1, false, peak(1, zero::Checkpointing::kNone));
  EXPECT_EQ(plan.checkpointing, zero::Checkpointing::kNone);
  EXPECT_EQ(plan.micro, 1);
  // Just below that: the first setting of the choice's order that lets a micro-batch fit, with
  // its largest micro-batch.
  const int64_t limit = peak(1, zero::Checkpointing::kNone) - 1;
  plan = plan_for_run(c, tiny, 1, false, limit);
  ASSERT_TRUE(plan.fits);
  ASSERT_NE(plan.checkpointing, zero::Checkpointing::kNone);
  zero::Checkpointing first = zero::Checkpointing::kNone;
  for (const auto& row : zero::activation_rows(zero::activation_input(c, tiny, false))) {
    if (row.setting != zero::Checkpointing::kNone && peak(1, row.setting) <= limit) {
      first = row.setting;
      break;
    }
  }
  EXPECT_EQ(plan.checkpointing, first);
  EXPECT_LE(peak(plan.micro, first), limit);
  for (int64_t larger : divisors_descending(8)) {
    if (larger > plan.micro) {
      EXPECT_GT(peak(larger, first), limit) << larger;
    }
  }
  EXPECT_GT(plan.micro, 1) << "the case should let checkpointing admit a larger micro-batch";
  EXPECT_THAT(describe_plan(plan, 1),
              HasSubstr("with gradient_checkpointing " + zero::checkpointing_word(first)));
  // Without checkpointing auto the run's own setting is planned for, fitting or not.
  c.model.checkpoint_auto = false;
  plan = plan_for_run(c, tiny, 1, false, limit);
  EXPECT_FALSE(plan.fits);
  EXPECT_EQ(plan.micro, 1);
  EXPECT_EQ(plan.checkpointing, zero::Checkpointing::kNone);
}

}  // namespace
}  // namespace dstrain::train
