// Schedule values at chosen steps against DeepSpeed's and Hugging Face's formulas, computed by
// hand.

#include <cmath>

#include <gtest/gtest.h>

#include "core/error.h"
#include "optim/lr_schedule.h"

namespace dstrain::optim {
namespace {

const double kPi = std::acos(-1.0);

LrScheduleOptions options(const std::string& type) {
  LrScheduleOptions o;
  o.type = type;
  return o;
}

TEST(LrSchedule, ConstantIsTheBaseLrEverywhere) {
  auto s = make_lr_schedule(options("constant"), 3e-4, 100);
  EXPECT_DOUBLE_EQ(s->lr(0), 3e-4);
  EXPECT_DOUBLE_EQ(s->lr(99), 3e-4);
}

TEST(LrSchedule, DeepSpeedWarmupLrLogWarmupThenFlat) {
  LrScheduleOptions o = options("WarmupLR");
  o.warmup_min_lr = 0.0;
  o.warmup_max_lr = 0.01;
  o.warmup_num_steps = 100;
  auto s = make_lr_schedule(o, 1.0, 1000);
  EXPECT_DOUBLE_EQ(s->lr(0), 0.0);                                        // log(1) = 0
  EXPECT_NEAR(s->lr(9), 0.01 * std::log(10.0) / std::log(100.0), 1e-15);  // = 0.005
  EXPECT_NEAR(s->lr(99), 0.01, 1e-15);
  EXPECT_DOUBLE_EQ(s->lr(100), 0.01);
  EXPECT_DOUBLE_EQ(s->lr(5000), 0.01);
}

TEST(LrSchedule, DeepSpeedWarmupLrLinearAndMaxLrDefaultsToBaseLr) {
  LrScheduleOptions o = options("WarmupLR");
  o.warmup_min_lr = 0.001;
  o.warmup_num_steps = 100;
  o.warmup_type = "linear";
  auto s = make_lr_schedule(o, 0.011, 1000);
  EXPECT_DOUBLE_EQ(s->lr(0), 0.001);
  EXPECT_NEAR(s->lr(50), 0.001 + 0.01 * 0.5, 1e-15);
  EXPECT_DOUBLE_EQ(s->lr(100), 0.011);
}

TEST(LrSchedule, DeepSpeedWarmupStepsBelowTwoCountAsTwo) {
  LrScheduleOptions o = options("WarmupLR");
  o.warmup_max_lr = 0.01;
  o.warmup_num_steps = 1;
  o.warmup_type = "linear";
  auto s = make_lr_schedule(o, 1.0, 10);
  EXPECT_DOUBLE_EQ(s->lr(1), 0.005);
  EXPECT_DOUBLE_EQ(s->lr(2), 0.01);
}

TEST(LrSchedule, DeepSpeedWarmupDecayLrDecaysLinearlyToZero) {
  LrScheduleOptions o = options("WarmupDecayLR");
  o.warmup_max_lr = 0.01;
  o.warmup_num_steps = 100;
  o.warmup_type = "linear";
  o.total_num_steps = 1000;
  auto s = make_lr_schedule(o, 1.0, 5);  // total_num_steps overrides the run's total
  EXPECT_DOUBLE_EQ(s->lr(100), 0.01);
  EXPECT_NEAR(s->lr(550), 0.01 * 450.0 / 900.0, 1e-15);
  EXPECT_DOUBLE_EQ(s->lr(1000), 0.0);
  EXPECT_DOUBLE_EQ(s->lr(1200), 0.0);
}

TEST(LrSchedule, DeepSpeedWarmupCosineLrUsesRatiosOfBaseLr) {
  LrScheduleOptions o = options("WarmupCosineLR");
  o.warmup_num_steps = 100;
  o.warmup_min_ratio = 0.1;
  o.warmup_type = "linear";
  auto s = make_lr_schedule(o, 0.02, 1000);  // cos_min_ratio keeps its default 0.0001
  EXPECT_NEAR(s->lr(0), 0.002, 1e-15);
  EXPECT_NEAR(s->lr(50), 0.02 * (0.1 + 0.5 * 0.9), 1e-15);
  EXPECT_NEAR(s->lr(100), 0.02 * (0.0001 + 0.9999 * (1 + std::cos(kPi * 1 / 900)) / 2), 1e-15);
  EXPECT_NEAR(s->lr(549), 0.02 * (0.0001 + 0.9999 * 0.5), 1e-15);
  EXPECT_NEAR(s->lr(999), 0.02 * 0.0001, 1e-15);
  EXPECT_NEAR(s->lr(1500), 0.02 * 0.0001, 1e-15);
}

TEST(LrSchedule, HuggingFaceLinearWarmupByRatioThenLinearDecay) {
  LrScheduleOptions o = options("linear");
  o.warmup_ratio = 0.1;
  auto s = make_lr_schedule(o, 1e-3, 100);
  EXPECT_DOUBLE_EQ(s->lr(0), 0.0);
  EXPECT_NEAR(s->lr(5), 5e-4, 1e-18);
  EXPECT_DOUBLE_EQ(s->lr(10), 1e-3);
  EXPECT_NEAR(s->lr(55), 5e-4, 1e-18);
  EXPECT_DOUBLE_EQ(s->lr(100), 0.0);
  o.min_lr_ratio = 0.1;
  EXPECT_NEAR(make_lr_schedule(o, 1e-3, 100)->lr(55), 1e-3 * (0.1 + 0.9 * 0.5), 1e-18);
}

TEST(LrSchedule, HuggingFaceWarmupRatioRoundsUp) {
  LrScheduleOptions o = options("constant_with_warmup");
  o.warmup_ratio = 0.1;
  auto s = make_lr_schedule(o, 1e-3, 95);  // ceil(9.5) = 10 warmup steps
  EXPECT_NEAR(s->lr(9), 9e-4, 1e-18);
  EXPECT_DOUBLE_EQ(s->lr(10), 1e-3);
}

TEST(LrSchedule, HuggingFaceCosineWithWarmupStepsAndMinLrRatio) {
  LrScheduleOptions o = options("cosine");
  o.warmup_steps = 10;
  o.warmup_ratio = 0.5;  // warmup_steps wins, as in Hugging Face
  auto s = make_lr_schedule(o, 1e-3, 110);
  EXPECT_NEAR(s->lr(5), 5e-4, 1e-18);
  EXPECT_NEAR(s->lr(60), 5e-4, 1e-15);
  EXPECT_NEAR(s->lr(110), 0.0, 1e-18);
  o.min_lr_ratio = 0.1;
  s = make_lr_schedule(o, 1e-3, 110);
  EXPECT_NEAR(s->lr(60), 1e-3 * (0.1 + 0.9 * 0.5), 1e-15);
  EXPECT_NEAR(s->lr(110), 1e-4, 1e-15);
}

void expect_config_error(const LrScheduleOptions& o, const std::string& fragment) {
  try {
    make_lr_schedule(o, 1e-3, 100);
    ADD_FAILURE() << "expected a config error mentioning " << fragment;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(LrSchedule, BadParametersAreConfigErrorsNamingTheKey) {
  expect_config_error(options("bogus"), "'bogus'");
  LrScheduleOptions o = options("WarmupLR");
  o.warmup_type = "exp";
  expect_config_error(o, "warmup_type");
  o = options("WarmupCosineLR");
  o.cos_min_ratio = 2;
  expect_config_error(o, "cos_min_ratio");
  o = options("WarmupCosineLR");
  o.warmup_num_steps = 100;
  expect_config_error(o, "total_num_steps");
  o = options("cosine");
  o.warmup_ratio = 1.5;
  expect_config_error(o, "warmup_ratio");
}

}  // namespace
}  // namespace dstrain::optim
