#pragma once
// Learning-rate schedules. Convention: lr(step) is the learning rate for optimizer update number
// `step`, counted from 0. The trainer calls optimizer.step(..., schedule.lr(step)) for step = 0, 1,
// ...
//
// DeepSpeed schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR) use DeepSpeed's parameter names and
// formulas, evaluated at last_batch_iteration = step. (DeepSpeed itself applies the value computed
// at iteration k to update k+1, because it steps the scheduler after the optimizer; we do not copy
// that off-by-one: update 0 gets the warmup's first value, warmup_min_lr.) Hugging Face schedules
// (linear, cosine, constant_with_warmup) are its LambdaLR factors at current_step = step, times
// base_lr, with decay floored at min_lr_ratio·base_lr.
//
// Parameters are validated when the schedule is built; a bad one is Error(kConfig) naming it.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace dstrain::optim {

struct LrScheduleOptions {
  // constant | constant_with_warmup | linear | cosine | WarmupLR | WarmupDecayLR | WarmupCosineLR
  std::string type = "constant";

  // DeepSpeed WarmupLR / WarmupDecayLR: the lr goes from warmup_min_lr to warmup_max_lr (default:
  // base_lr) over max(2, warmup_num_steps) steps by `warmup_type` (log | linear); WarmupDecayLR
  // then decays linearly to 0 at total_num_steps (default: the run's total steps).
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr;
  int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";
  std::optional<int64_t> total_num_steps;
  // DeepSpeed WarmupCosineLR: ratios of base_lr (the optimizer's lr).
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;

  // Hugging Face style: warmup_steps if set, else ceil(warmup_ratio · total_steps) linear warmup
  // from 0; then linear or cosine decay to min_lr_ratio · base_lr at total_steps.
  double warmup_ratio = 0.0;
  std::optional<int64_t> warmup_steps;
  double min_lr_ratio = 0.0;
};

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // Learning rate for update number `step` (0-based, >= 0).
  virtual double lr(int64_t step) const = 0;
};

// total_steps: the number of optimizer updates in the run (> 0).
std::unique_ptr<LrSchedule> make_lr_schedule(const LrScheduleOptions& options, double base_lr,
                                             int64_t total_steps);

}  // namespace dstrain::optim
