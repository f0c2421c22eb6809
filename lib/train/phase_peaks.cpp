#include "train/phase_peaks.h"

#include <algorithm>

#if DSTRAIN_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace dstrain::train {

PhasePeaks::PhasePeaks(PeakSource take_peak) : take_peak_(std::move(take_peak)) {}

int64_t PhasePeaks::end(StepPhase phase) {
  if (!take_peak_) return 0;
  const int64_t peak = take_peak_();
  int64_t& slot = interval_[static_cast<size_t>(phase)];
  slot = std::max(slot, peak);
  run_ = std::max(run_, peak);
  return peak;
}

std::vector<std::pair<std::string, double>> PhasePeaks::take_metrics() {
  std::vector<std::pair<std::string, double>> out;
  if (!take_peak_) return out;
  const char* names[] = {"forward", "backward", "optimizer"};
  for (size_t i = 0; i < interval_.size(); ++i) {
    if (interval_[i] < 0) continue;
    out.emplace_back(std::string("memory/peak_allocated_mb/") + names[i],
                     static_cast<double>(interval_[i]) / 1e6);
    interval_[i] = -1;
  }
  out.emplace_back("memory/peak_allocated_mb", static_cast<double>(run_) / 1e6);
  return out;
}

trace::Arg peak_arg(PhasePeaks& peaks, StepPhase phase) {
  const int64_t bytes = peaks.end(phase);
  return peaks.active() ? trace::Arg{"peak_allocated_mb", bytes / 1'000'000} : trace::Arg{};
}

PhasePeaks::PeakSource allocator_peak_source(const torch::Device& device) {
#if DSTRAIN_CUDA
  if (device.is_cuda()) {
    const auto index = device.index();
    return [index] {
      using namespace c10::cuda::CUDACachingAllocator;
      constexpr size_t kAggregate = 0;  // StatType::AGGREGATE
      const int64_t peak = getDeviceStats(index).allocated_bytes[kAggregate].peak;
      resetPeakStats(index);
      return peak;
    };
  }
#endif
  (void)device;
  return {};
}

}  // namespace dstrain::train
