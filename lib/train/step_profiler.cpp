#include "train/step_profiler.h"

#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include "core/fs.h"
#include "core/log.h"
#include "core/run_files.h"

namespace dstrain::train {

namespace {

namespace prof = torch::profiler::impl;

std::set<prof::ActivityType> activities(bool cuda) {
  std::set<prof::ActivityType> a = {prof::ActivityType::CPU};
  if (cuda) a.insert(prof::ActivityType::CUDA);
  return a;
}

prof::ProfilerConfig kineto_config() {
  return prof::ProfilerConfig(prof::ProfilerState::KINETO, /*report_input_shapes=*/true);
}

}  // namespace

StepProfiler::StepProfiler(int64_t steps, int64_t first_step, int64_t total_steps, bool cuda,
                           std::string out_dir, int rank)
    : cuda_(cuda), rank_(rank) {
  if (steps <= 0 || first_step >= total_steps) return;
  constexpr int64_t kWarmup = 2;
  begin_ = std::max(first_step, std::min(first_step + kWarmup, total_steps - steps));
  end_ = std::min(begin_ + steps, total_steps);
  path_ = run_files::profile_file(out_dir, rank);
}

StepProfiler::~StepProfiler() {
  if (!active_) return;
  try {
    torch::autograd::profiler::disableProfiler();  // an error left the profiled steps early
  } catch (const std::exception& e) {
    log::warn("stopping the profiler: {}", e.what());
  }
}

void StepProfiler::before_step(int64_t step) {
  if (step != begin_ || begin_ == end_) return;
  if (cuda_) {
    torch::cuda::synchronize();  // earlier steps' kernels stay out of the profile
  } else {
    // Kineto looks for GPUs even when asked for the CPU only, and on a machine without a CUDA
    // driver logs an ERROR line about it that is no error of the run (a user's setting wins).
    setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  }
  torch::autograd::profiler::prepareProfiler(kineto_config(), activities(cuda_));
  torch::autograd::profiler::enableProfiler(kineto_config(), activities(cuda_));
  active_ = true;
}

void StepProfiler::after_step(int64_t steps_done) {
  if (active_ && steps_done == end_) stop();
}

void StepProfiler::stop() {
  if (cuda_) torch::cuda::synchronize();  // the last step's kernels end inside the profile
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
      torch::autograd::profiler::disableProfiler();
  active_ = false;
  try {
    // Kineto writes the file itself: write it beside and rename, so no reader sees half of it.
    fs::create_dirs(std::filesystem::path(path_).parent_path());
    const std::string partial = path_ + ".partial";
    result->save(partial);
    std::filesystem::rename(partial, path_);
  } catch (const std::exception& e) {
    log::warn("writing the profile {} failed (the run itself is unaffected): {}", path_, e.what());
    return;
  }
  if (rank_ == 0) {
    const std::string steps = end_ == begin_ + 1 ? fmt::format("step {}", end_)
                                                 : fmt::format("steps {}-{}", begin_ + 1, end_);
    log::info("profile of {}: {} ({} events; a file per rank); open it in https://ui.perfetto.dev",
              steps, path_, result->events().size());
  }
}

}  // namespace dstrain::train
