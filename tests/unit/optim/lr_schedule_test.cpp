// Schedule values at chosen steps against DeepSpeed's and Hugging Face's formulas, computed by
// hand.

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

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

// A schedule's value at one step; tol 0 asks for equality up to 4 ulps (EXPECT_DOUBLE_EQ).
struct Point {
  int64_t step;
  double lr;
  double tol = 0;
};

// One schedule built from `options` for a run of `total_steps` at `base_lr`, and what it must give.
struct LrCase {
  std::string name;
  LrScheduleOptions options;
  double base_lr;
  int64_t total_steps;
  std::vector<Point> points;
};

LrScheduleOptions with(const std::string& type,
                       const std::function<void(LrScheduleOptions&)>& set) {
  LrScheduleOptions o = options(type);
  set(o);
  return o;
}

std::vector<LrCase> schedule_cases() {
  const double cos_at_100 = 0.02 * (0.0001 + 0.9999 * (1 + std::cos(kPi * 1 / 900)) / 2);
  return {
      {"ConstantIsTheBaseLrEverywhere", options("constant"), 3e-4, 100, {{0, 3e-4}, {99, 3e-4}}},
      {"DeepSpeedWarmupLrLogWarmupThenFlat",
       with("WarmupLR",
            [](LrScheduleOptions& o) {
              o.warmup_min_lr = 0.0;
              o.warmup_max_lr = 0.01;
              o.warmup_num_steps = 100;
            }),
       1.0,
       1000,
       {{0, 0.0},                                             // log(1) = 0
        {9, 0.01 * std::log(10.0) / std::log(100.0), 1e-15},  // = 0.005
        {99, 0.01, 1e-15},
        {100, 0.01},
        {5000, 0.01}}},
      {"DeepSpeedWarmupLrLinearAndMaxLrDefaultsToBaseLr",
       with("WarmupLR",
            [](LrScheduleOptions& o) {
              o.warmup_min_lr = 0.001;
              o.warmup_num_steps = 100;
              o.warmup_type = "linear";
            }),
       0.011,
       1000,
       {{0, 0.001}, {50, 0.001 + 0.01 * 0.5, 1e-15}, {100, 0.011}}},
      {"DeepSpeedWarmupStepsBelowTwoCountAsTwo",
       with("WarmupLR",
            [](LrScheduleOptions& o) {
              o.warmup_max_lr = 0.01;
              o.warmup_num_steps = 1;
              o.warmup_type = "linear";
            }),
       1.0,
       10,
       {{1, 0.005}, {2, 0.01}}},
      {"DeepSpeedWarmupDecayLrDecaysLinearlyToZero",
       with("WarmupDecayLR",
            [](LrScheduleOptions& o) {
              o.warmup_max_lr = 0.01;
              o.warmup_num_steps = 100;
              o.warmup_type = "linear";
              o.total_num_steps = 1000;  // overrides the run's total of 5
            }),
       1.0,
       5,
       {{100, 0.01}, {550, 0.01 * 450.0 / 900.0, 1e-15}, {1000, 0.0}, {1200, 0.0}}},
      {"DeepSpeedWarmupCosineLrUsesRatiosOfBaseLr",
       with("WarmupCosineLR",
            [](LrScheduleOptions& o) {
              o.warmup_num_steps = 100;
              o.warmup_min_ratio = 0.1;
              o.warmup_type = "linear";  // cos_min_ratio keeps its default 0.0001
            }),
       0.02,
       1000,
       {{0, 0.002, 1e-15},
        {50, 0.02 * (0.1 + 0.5 * 0.9), 1e-15},
        {100, cos_at_100, 1e-15},
        {549, 0.02 * (0.0001 + 0.9999 * 0.5), 1e-15},
        {999, 0.02 * 0.0001, 1e-15},
        {1500, 0.02 * 0.0001, 1e-15}}},
      {"HuggingFaceLinearWarmupByRatioThenLinearDecay",
       with("linear", [](LrScheduleOptions& o) { o.warmup_ratio = 0.1; }),
       1e-3,
       100,
       {{0, 0.0}, {5, 5e-4, 1e-18}, {10, 1e-3}, {55, 5e-4, 1e-18}, {100, 0.0}}},
      {"HuggingFaceLinearDecayFloorsAtMinLrRatio",
       with("linear",
            [](LrScheduleOptions& o) {
              o.warmup_ratio = 0.1;
              o.min_lr_ratio = 0.1;
            }),
       1e-3,
       100,
       {{55, 1e-3 * (0.1 + 0.9 * 0.5), 1e-18}}},
      {"HuggingFaceWarmupRatioRoundsUp",
       with("constant_with_warmup", [](LrScheduleOptions& o) { o.warmup_ratio = 0.1; }),
       1e-3,
       95,  // ceil(9.5) = 10 warmup steps
       {{9, 9e-4, 1e-18}, {10, 1e-3}}},
      {"HuggingFaceCosineWarmupStepsWinOverRatio",
       with("cosine",
            [](LrScheduleOptions& o) {
              o.warmup_steps = 10;
              o.warmup_ratio = 0.5;  // warmup_steps wins, as in Hugging Face
            }),
       1e-3,
       110,
       {{5, 5e-4, 1e-18}, {60, 5e-4, 1e-15}, {110, 0.0, 1e-18}}},
      {"HuggingFaceCosineFloorsAtMinLrRatio",
       with("cosine",
            [](LrScheduleOptions& o) {
              o.warmup_steps = 10;
              o.min_lr_ratio = 0.1;
            }),
       1e-3,
       110,
       {{60, 1e-3 * (0.1 + 0.9 * 0.5), 1e-15}, {110, 1e-4, 1e-15}}},
  };
}

void PrintTo(const LrCase& c, std::ostream* os) {
  *os << c.name;
}

class LrScheduleValues : public ::testing::TestWithParam<LrCase> {};

TEST_P(LrScheduleValues, MatchTheFormulaAtEachStep) {
  const LrCase& c = GetParam();
  auto s = make_lr_schedule(c.options, c.base_lr, c.total_steps);
  for (const Point& p : c.points) {
    if (p.tol == 0) {
      EXPECT_DOUBLE_EQ(s->lr(p.step), p.lr) << "step " << p.step;
    } else {
      EXPECT_NEAR(s->lr(p.step), p.lr, p.tol) << "step " << p.step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Schedules, LrScheduleValues, ::testing::ValuesIn(schedule_cases()),
                         [](const ::testing::TestParamInfo<LrCase>& info) {
                           return info.param.name;
                         });

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
