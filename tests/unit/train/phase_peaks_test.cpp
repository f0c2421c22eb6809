// memory/peak_allocated_mb by phase (train/phase_peaks.h), with a scripted allocator peak: each
// end() takes the peak since the previous one, metrics keep each phase's largest since they were
// last taken, and the run's peak is the largest of all.

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <memory>

#include "train/phase_peaks.h"

namespace dstrain::train {
namespace {

std::map<std::string, double> as_map(const std::vector<std::pair<std::string, double>>& m) {
  return {m.begin(), m.end()};
}

TEST(PhasePeaks, EachPhaseKeepsItsLargestPeakAndTheRunTheLargestOfAll) {
  auto readings = std::make_shared<std::deque<int64_t>>(
      std::deque<int64_t>{5'000'000, 9'000'000, 7'000'000, 3'000'000, 2'000'000, 4'000'000});
  int calls = 0;
  PhasePeaks peaks([readings, &calls] {
    ++calls;
    const int64_t v = readings->front();
    readings->pop_front();
    return v;
  });
  ASSERT_TRUE(peaks.active());
  // Two micro-steps, then the optimizer.
  EXPECT_EQ(peaks.end(StepPhase::kForward), 5'000'000);
  EXPECT_EQ(peaks.end(StepPhase::kBackward), 9'000'000);
  EXPECT_EQ(peaks.end(StepPhase::kForward), 7'000'000);
  EXPECT_EQ(peaks.end(StepPhase::kBackward), 3'000'000);
  EXPECT_EQ(peaks.end(StepPhase::kOptimizer), 2'000'000);
  EXPECT_EQ(calls, 5);
  const auto first = as_map(peaks.take_metrics());
  EXPECT_EQ(first.at("memory/peak_allocated_mb/forward"), 7.0);
  EXPECT_EQ(first.at("memory/peak_allocated_mb/backward"), 9.0);
  EXPECT_EQ(first.at("memory/peak_allocated_mb/optimizer"), 2.0);
  EXPECT_EQ(first.at("memory/peak_allocated_mb"), 9.0);
  // Taken: the next interval reports only the phases that ran since, the run's peak stays.
  EXPECT_EQ(peaks.end(StepPhase::kForward), 4'000'000);
  const auto second = as_map(peaks.take_metrics());
  EXPECT_EQ(second.size(), 2u);
  EXPECT_EQ(second.at("memory/peak_allocated_mb/forward"), 4.0);
  EXPECT_EQ(second.at("memory/peak_allocated_mb"), 9.0);
}

TEST(PhasePeaks, WithoutAnAllocatorNothingIsMeasured) {
  PhasePeaks peaks(allocator_peak_source(torch::Device(torch::kCPU)));
  EXPECT_FALSE(peaks.active());
  EXPECT_EQ(peaks.end(StepPhase::kForward), 0);
  EXPECT_TRUE(peaks.take_metrics().empty());
}

}  // namespace
}  // namespace dstrain::train
