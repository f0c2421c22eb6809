#include "zero/loss_scaler.h"

#include <gtest/gtest.h>

namespace dstrain::zero {
namespace {

TEST(LossScaler, DisabledScalerNeverSkipsOrScales) {
  LossScaler s(false, {});
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, OverflowSkipsAndHalvesAfterHysteresis) {
  LossScaler s(true, {/*initial_scale_power=*/4, /*window=*/1000, /*hysteresis=*/2, 1.0});
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_TRUE(s.update(true));  // tolerated once
  EXPECT_EQ(s.scale(), 16.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 8.0);
  EXPECT_TRUE(s.update(true));  // budget not refilled until growth
  EXPECT_EQ(s.scale(), 4.0);
}

TEST(LossScaler, GrowsAfterWindowOfGoodStepsAndRespectsMinimum) {
  LossScaler s(true, {1, 3, 1, 1.0});
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1.0);  // min_loss_scale
  EXPECT_FALSE(s.update(false));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 2.0);
}

// DeepSpeed's fp16.loss_scale > 0: a fixed scale; overflowing steps are skipped, nothing moves.
TEST(LossScaler, StaticScaleSkipsOverflowsAndNeverChanges) {
  LossScalingOptions o;
  o.initial_scale_power = 4;
  o.loss_scale_window = 2;
  o.static_scale = 128;
  LossScaler s(true, o);
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 128.0);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 128.0);
}

TEST(LossScaler, StateRoundTrips) {
  LossScaler a(true, {8, 10, 2, 1.0});
  a.update(true);
  a.update(false);
  LossScaler b(true, {8, 10, 2, 1.0});
  b.load_state(a.state());
  EXPECT_EQ(b.state().scale, a.state().scale);
  EXPECT_EQ(b.state().good_steps, 1);
  EXPECT_EQ(b.state().hysteresis_left, 1);
}

}  // namespace
}  // namespace dstrain::zero
