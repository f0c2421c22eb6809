#pragma once
// logging.profile_steps: the PyTorch profiler (Kineto) over a few steps of a run — operators on
// the host and, on a GPU, every kernel and copy with its device time — saved per rank as a Chrome
// trace (<out_dir>/profile/rank-<K>.json) for Perfetto, chrome://tracing or TensorBoard.

#include <cstdint>
#include <memory>
#include <string>

namespace dstrain::train {

class StepProfiler {
 public:
  // Profiles `steps` steps (0 = none) of a run whose steps are [first_step, total_steps): after two
  // warm-up steps (allocator, cuBLAS/cuDNN autotuning) where the run is long enough.
  StepProfiler(int64_t steps, int64_t first_step, int64_t total_steps, bool cuda,
               std::string out_dir, int rank);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around each step: before it with its 0-based index, after it with the steps done.
  void before_step(int64_t step);
  void after_step(int64_t steps_done);

 private:
  void stop();
  int64_t begin_ = 0;
  int64_t end_ = 0;
  bool cuda_ = false;
  bool active_ = false;
  std::string path_;
  int rank_ = 0;
};

}  // namespace dstrain::train
