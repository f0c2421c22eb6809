#pragma once
// memory/peak_allocated_mb by phase of the step: the CUDA caching allocator's peak during each
// micro-step's forward and backward and during the optimizer step, in metrics.jsonl and on the
// phase's span in the trace (logging.trace), so that a peak can be told apart: activations at
// the end of forward, gradients in backward, the optimizer's transients.
//
// How: the allocator keeps one peak; end(phase) reads it and resets it, so each reading is the
// peak since the previous end — the phase, and whatever ran on the host between it and the phase
// before (the batch copied to the device belongs to the forward after it). The run's peak
// (memory/peak_allocated_mb, as before: torch.cuda.max_memory_allocated since the start) is the
// largest of the readings, the first of which covers everything before the first step.
// The allocator's peak is host-side bookkeeping of what was allocated when the work was enqueued,
// so reading it needs no device synchronisation.
//
// On the CPU there is no such allocator: no source, no metrics, end() returns 0.

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "core/trace.h"

namespace dstrain::train {

enum class StepPhase { kForward, kBackward, kOptimizer };

class PhasePeaks {
 public:
  // The allocator's peak in bytes since the previous call, which resets it.
  using PeakSource = std::function<int64_t()>;

  // Without a source (the CPU) nothing is measured.
  explicit PhasePeaks(PeakSource take_peak);
  bool active() const { return static_cast<bool>(take_peak_); }

  // The phase that just ended: its peak in bytes (0 when not active), kept for take_metrics().
  int64_t end(StepPhase phase);

  // memory/peak_allocated_mb/{forward,backward,optimizer}: each phase's largest peak since the
  // previous call (phases that did not run since are left out), then memory/peak_allocated_mb: the
  // run's; MB as device_memory_metrics gives them. Empty when not active.
  std::vector<std::pair<std::string, double>> take_metrics();

 private:
  PeakSource take_peak_;
  std::array<int64_t, 3> interval_{-1, -1, -1};  // -1: the phase has not run since
  int64_t run_ = 0;
};

// The phase that just ended, as its trace span's argument: its peak in MB; none when not active.
trace::Arg peak_arg(PhasePeaks& peaks, StepPhase phase);

// The CUDA caching allocator's peak on `device` (getDeviceStats, then resetPeakStats); an empty
// source on the CPU and in a build without CUDA.
PhasePeaks::PeakSource allocator_peak_source(const torch::Device& device);

}  // namespace dstrain::train
