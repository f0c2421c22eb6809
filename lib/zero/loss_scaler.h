#pragma once
// Dynamic loss scaling for fp16 compute. fp16 gradients underflow unless the loss is multiplied by
// a large scale before backward; too large a scale overflows to inf/nan instead. The scaler starts
// at 2^initial_scale_power, halves after an overflow (the step is skipped), and doubles again after
// loss_scale_window consecutive good steps. `hysteresis` overflows are tolerated (step skipped,
// scale kept) before the first halving; the budget refills when the scale grows. The scale never
// goes below min_loss_scale. With static_scale > 0 (DeepSpeed's fp16.loss_scale) the scale is that
// value for good: an overflowing step is still skipped, nothing else changes. Every rank must feed
// the same overflow verdict (the engine agrees it across ranks).

#include <cstdint>

#include "ckpt/stateful.h"

namespace dstrain::zero {

struct LossScalingOptions {
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1.0;
  double static_scale = 0.0;  // > 0: a fixed scale (no growth, no halving)
};

// What a checkpoint needs to continue scaling exactly where it stopped.
struct LossScalerState {
  double scale = 1.0;
  int64_t good_steps = 0;   // consecutive steps without overflow since the last change
  int hysteresis_left = 1;  // overflows still tolerated before the next halving
};

// A checkpoint component (ckpt/stateful.h): its state is LossScalerState as JSON.
class LossScaler : public ckpt::Stateful {
 public:
  // enabled == false: scale stays 1 and update() never changes it (fp32/bf16 compute).
  LossScaler(bool enabled, const LossScalingOptions& options);

  bool enabled() const { return enabled_; }
  double scale() const { return state_.scale; }
  // Records one step's verdict; returns true when the step must be skipped (overflow, enabled).
  bool update(bool overflow);

  const LossScalerState& state() const { return state_; }
  void load_state(const LossScalerState& state) { state_ = state; }

  int state_version() const override { return 1; }
  ckpt::State snapshot_state(ckpt::Snapshot how) const override;
  void restore_state(const ckpt::StateIn& in) override;

 private:
  bool enabled_;
  LossScalingOptions options_;
  LossScalerState state_;
};

}  // namespace dstrain::zero
