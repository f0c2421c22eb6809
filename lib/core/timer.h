#pragma once
// Wall-clock stopwatch on the monotonic clock, for the time breakdown in metrics.

#include <chrono>

namespace dstrain {

class Stopwatch {
 public:
  Stopwatch() : start_(Clock::now()) {}
  void reset() { start_ = Clock::now(); }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  using Clock = std::chrono::steady_clock;
  Clock::time_point start_;
};

// Accumulates time into named buckets (forward, backward, comm, optimizer, data, ...).
double now_seconds();

}  // namespace dstrain
