// per_device_train_batch_size: auto's choice (train/micro_batch_auto.h): the candidates keep the
// global batch exact, the largest that fits a limit is taken (memory or the global batch bounding
// it). The predictions themselves: run_plan_test.cpp.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "config/config.h"
#include "core/error.h"
#include "train/micro_batch_auto.h"

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

}  // namespace
}  // namespace dstrain::train
