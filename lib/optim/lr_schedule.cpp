#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "core/error.h"

namespace dstrain::optim {
namespace {

constexpr double kPi = 3.14159265358979323846;

class FunctionSchedule : public LrSchedule {
 public:
  explicit FunctionSchedule(std::function<double(int64_t)> fn) : fn_(std::move(fn)) {}
  double lr(int64_t step) const override { return fn_(std::max<int64_t>(step, 0)); }

 private:
  std::function<double(int64_t)> fn_;
};

void require(bool ok, const std::string& type, const char* key, const std::string& expected) {
  if (!ok) fail(ErrorKind::kConfig, "lr schedule {}: {} must be {}", type, key, expected);
}

// DeepSpeed's warmup fraction at iteration `it` (< warmup): log or linear in [0, 1).
std::function<double(int64_t)> ds_warmup_gamma(const LrScheduleOptions& o) {
  const int64_t warmup = std::max<int64_t>(2, o.warmup_num_steps);
  const bool log = o.warmup_type == "log";
  return [warmup, log](int64_t it) {
    return log ? std::log(static_cast<double>(it + 1)) / std::log(static_cast<double>(warmup))
               : static_cast<double>(it) / static_cast<double>(warmup);
  };
}

std::unique_ptr<LrSchedule> deepspeed_schedule(const LrScheduleOptions& o, double base_lr,
                                               int64_t total_steps) {
  const std::string& type = o.type;
  require(o.warmup_num_steps >= 0, type, "warmup_num_steps", "non-negative");
  require(o.warmup_type == "log" || o.warmup_type == "linear", type, "warmup_type",
          "'log' or 'linear' (got '" + o.warmup_type + "')");
  const int64_t warmup = std::max<int64_t>(2, o.warmup_num_steps);
  const int64_t total = o.total_num_steps.value_or(total_steps);
  auto gamma = ds_warmup_gamma(o);
  if (type == "WarmupCosineLR") {
    require(o.warmup_min_ratio >= 0 && o.warmup_min_ratio <= 1, type, "warmup_min_ratio",
            "in [0, 1]");
    require(o.cos_min_ratio >= 0 && o.cos_min_ratio <= 1, type, "cos_min_ratio", "in [0, 1]");
    require(total > warmup, type, "total_num_steps", "greater than warmup_num_steps (at least 2)");
    return std::make_unique<FunctionSchedule>([=](int64_t it) {
      if (it < warmup) return base_lr * (o.warmup_min_ratio + gamma(it) * (1 - o.warmup_min_ratio));
      // From total_num_steps on DeepSpeed's cosine would climb again; we hold its final value.
      const double done =
          static_cast<double>(std::min(it, total - 1) - warmup + 1) / (total - warmup);
      const double cosine = (1 + std::cos(kPi * done)) / 2;
      return base_lr * std::max(0.0, o.cos_min_ratio + (1 - o.cos_min_ratio) * cosine);
    });
  }
  const double min_lr = o.warmup_min_lr, max_lr = o.warmup_max_lr.value_or(base_lr);
  require(min_lr >= 0, type, "warmup_min_lr", "non-negative");
  require(max_lr >= 0, type, "warmup_max_lr", "non-negative");
  const bool decay = type == "WarmupDecayLR";
  if (decay) require(total >= warmup, type, "total_num_steps", "at least warmup_num_steps");
  return std::make_unique<FunctionSchedule>([=](int64_t it) {
    double g = 1.0;
    if (it < warmup) {
      g = gamma(it);
    } else if (decay) {
      g = std::max(0.0, static_cast<double>(total - it) / std::max<double>(1.0, total - warmup));
    }
    return min_lr + (max_lr - min_lr) * g;
  });
}

std::unique_ptr<LrSchedule> hf_schedule(const LrScheduleOptions& o, double base_lr, int64_t total) {
  const std::string& type = o.type;
  require(o.warmup_ratio >= 0 && o.warmup_ratio <= 1, type, "warmup_ratio", "in [0, 1]");
  require(!o.warmup_steps || *o.warmup_steps >= 0, type, "warmup_steps", "non-negative");
  require(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1, type, "min_lr_ratio", "in [0, 1]");
  const int64_t warmup =
      o.warmup_steps && *o.warmup_steps > 0
          ? *o.warmup_steps
          : static_cast<int64_t>(std::ceil(o.warmup_ratio * static_cast<double>(total)));
  const double floor = o.min_lr_ratio;
  return std::make_unique<FunctionSchedule>([=](int64_t step) {
    if (step < warmup) return base_lr * static_cast<double>(step) / std::max<int64_t>(1, warmup);
    if (type == "constant_with_warmup") return base_lr;
    const double progress = static_cast<double>(step - warmup) /
                            static_cast<double>(std::max<int64_t>(1, total - warmup));
    const double factor = type == "cosine" ? 0.5 * (1 + std::cos(kPi * std::min(progress, 1.0)))
                                           : std::max(0.0, 1.0 - progress);
    return base_lr * (floor + (1 - floor) * factor);
  });
}

}  // namespace

std::unique_ptr<LrSchedule> make_lr_schedule(const LrScheduleOptions& options, double base_lr,
                                             int64_t total_steps) {
  if (!(base_lr >= 0)) fail(ErrorKind::kConfig, "learning rate {} must not be negative", base_lr);
  if (total_steps <= 0)
    fail(ErrorKind::kConfig, "total training steps {} must be positive", total_steps);
  const std::string& type = options.type;
  if (type == "constant") {
    return std::make_unique<FunctionSchedule>([base_lr](int64_t) { return base_lr; });
  }
  if (type == "WarmupLR" || type == "WarmupDecayLR" || type == "WarmupCosineLR") {
    return deepspeed_schedule(options, base_lr, total_steps);
  }
  if (type == "linear" || type == "cosine" || type == "constant_with_warmup") {
    return hf_schedule(options, base_lr, total_steps);
  }
  fail(ErrorKind::kConfig,
       "lr schedule type '{}' is not one of constant, constant_with_warmup, linear, cosine, "
       "WarmupLR, "
       "WarmupDecayLR, WarmupCosineLR",
       type);
}

}  // namespace dstrain::optim
