#include "zero/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dstrain::zero {

LossScaler::LossScaler(bool enabled, const LossScalingOptions& options)
    : enabled_(enabled), options_(options) {
  if (!enabled_) return;
  if (options.loss_scale_window < 1 || options.hysteresis < 1 || options.min_loss_scale <= 0) {
    fail(ErrorKind::kConfig,
         "fp16 loss scaling: loss_scale_window ({}) and hysteresis ({}) must be >= 1 and "
         "min_loss_scale ({}) > 0",
         options.loss_scale_window, options.hysteresis, options.min_loss_scale);
  }
  state_.scale = options.static_scale > 0 ? options.static_scale
                                          : std::ldexp(1.0, options.initial_scale_power);
  state_.hysteresis_left = options.hysteresis;
}

bool LossScaler::update(bool overflow) {
  if (!enabled_) return false;
  if (options_.static_scale > 0) return overflow;
  if (overflow) {
    state_.good_steps = 0;
    if (state_.hysteresis_left > 1) {
      --state_.hysteresis_left;
    } else {
      state_.scale = std::max(state_.scale / 2, options_.min_loss_scale);
    }
    return true;
  }
  if (++state_.good_steps >= options_.loss_scale_window) {
    state_.scale *= 2;
    state_.good_steps = 0;
    state_.hysteresis_left = options_.hysteresis;
  }
  return false;
}

ckpt::State LossScaler::snapshot_state(ckpt::Snapshot) const {
  ckpt::State s;
  s.json = {{"scale", state_.scale},
            {"good_steps", state_.good_steps},
            {"hysteresis_left", state_.hysteresis_left}};
  return s;
}

void LossScaler::restore_state(const ckpt::StateIn& in) {
  try {
    const auto& j = in.json();
    state_.scale = j.at("scale").get<double>();
    state_.good_steps = j.at("good_steps").get<int64_t>();
    state_.hysteresis_left = j.at("hysteresis_left").get<int>();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInput, "{}: {}", in.origin(), e.what());
  }
}

}  // namespace dstrain::zero
