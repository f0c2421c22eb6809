#pragma once
// The trainer's own checkpoint components (ckpt/stateful.h), beside the engine, its loss scaler
// and the data loader:
//   "progress"  the step, the tokens seen, the last step's loss, this rank's CPU RNG state, and
//               the micro-batch per_device_train_batch_size: auto chose (train/micro_batch_auto.h)
//   "lora"      the reference to the frozen base a LoRA run trains on: the adapter settings and
//               the base's checksum, which a resumed run must match

#include <cstdint>
#include <string>

#include "ckpt/stateful.h"

namespace dstrain::train {

// Reads and writes the trainer's counters in place (they must outlive it). `micro_batch_auto`,
// unless null, is saved as that key: the trainer reads it from the manifest before restoring (the
// loader is built for it), so restoring reads nothing of it.
class ProgressState : public ckpt::Stateful {
 public:
  ProgressState(int64_t& step, int64_t& tokens_seen, double& train_loss,
                nlohmann::json micro_batch_auto = nullptr)
      : step_(step),
        tokens_seen_(tokens_seen),
        train_loss_(train_loss),
        micro_batch_auto_(std::move(micro_batch_auto)) {}
  int state_version() const override { return 1; }
  ckpt::State snapshot_state(ckpt::Snapshot how) const override;
  void restore_state(const ckpt::StateIn& in) override;

 private:
  int64_t& step_;
  int64_t& tokens_seen_;
  double& train_loss_;
  nlohmann::json micro_batch_auto_;
};

class LoraReference : public ckpt::Stateful {
 public:
  // `reference`: the adapter settings and {"base": {..., "checksum"}} of this run.
  explicit LoraReference(nlohmann::json reference) : reference_(std::move(reference)) {}
  int state_version() const override { return 1; }
  ckpt::State snapshot_state(ckpt::Snapshot how) const override;
  // Error(kInput) when the saved base checksum differs from this run's.
  void restore_state(const ckpt::StateIn& in) override;

 private:
  nlohmann::json reference_;
};

}  // namespace dstrain::train
