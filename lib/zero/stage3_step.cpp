// Stage3Engine: the step around the MasterState's update (the fp32 gradient shard in, the
// parameter shard and the persistent unit refreshed after), memory accounting and loading state.
#include "zero/stage3_engine.h"

namespace dstrain::zero {

NormShare Stage3Engine::prepare_step() {
  torch::NoGradGuard no_grad;
  stale_trainable_units();
  if (master_->backward_update_armed()) {
    size_t reduced_units = 0;
    for (const Unit& unit : units_)
      reduced_units += !unit.frozen() && unit.partition.padded_numel();
    return master_->backward_update_share(reduced_units);
  }
  // The gradient shard in fp32 where the master lives (the host when offloading the optimizer).
  grad32_ = grad_shard_.to(master_->master().device(), torch::kFloat32);
  master_->finalize_gradients(grad32_);
  return {squared_norm(grad32_), master_->copies_sq(grad32_)};
}

StepResult Stage3Engine::reduce_norm(const NormShare& share) {
  return master_->reduce_norm(share.owned_sq, share.copies_sq);
}

void Stage3Engine::finish_step(const StepResult& result, double lr) {
  torch::NoGradGuard no_grad;
  if (!grad32_.defined()) {
    gather_persistent();  // updated during backward
  } else if (!result.skipped) {
    master_->begin_update(lr);
    master_->update(std::move(grad32_), 0, master_->coefficient(result));
    refresh_params();
  }
  grad32_ = torch::Tensor();
  grad_shard_.zero_();
}

// Master → compute-dtype parameter shard (a copy back to the device when offloading), then the
// persistent unit's all-gather. Other units are gathered when next used.
void Stage3Engine::refresh_params() {
  if (!master_->aliases_params()) param_shard_.copy_(master_->master());
  gather_persistent();
}

void Stage3Engine::gather_persistent() {
  Unit& persistent = units_[persistent_unit_];
  if (persistent.partition.padded_numel() == 0) return;
  torch::Tensor input = shard_of(persistent, param_shard_).to(device_);
  comm_.all_gather(persistent.full, input)->wait();
}

MemoryReport Stage3Engine::bytes() const {
  MemoryReport report;
  // Frozen (LoRA base) shards are parameters in the compute dtype too.
  const int64_t persistent =
      units_[persistent_unit_].full.nbytes() + units_[persistent_frozen_unit_].full.nbytes();
  report.compute_params = param_shard_.nbytes() + frozen_shard_.nbytes() + persistent;
  report.persistent_params = persistent;
  report.gradients = grad_shard_.nbytes();
  report.master_weights = master_->master_bytes();
  report.optimizer_state = master_->optimizer_bytes();
  report.gathered_params = gathered_bytes();
  report.gathered_params_peak = gathered_peak_;
  // What offload moves to the host (on a CPU-only machine host and device are one memory, so this
  // is counted by intent, not by the tensors' device).
  if (options_.offload_param) report.host_bytes += param_shard_.nbytes() + frozen_shard_.nbytes();
  if (options_.offload_optimizer)
    report.host_bytes += report.master_weights + report.optimizer_state + report.gradients;
  return report;
}

// Backward completed every reduction (finish_backward): only the shard holds the gradients.
void Stage3Engine::do_discard() {
  torch::NoGradGuard no_grad;
  grad_shard_.zero_();
}

void Stage3Engine::do_load_state(const StateSource& source, int64_t step_count,
                                 const LossScalerState& scaler) {
  torch::NoGradGuard no_grad;
  stale_trainable_units();
  master_->load_state(source, step_count, scaler);
  refresh_params();
  grad_shard_.zero_();
}

}  // namespace dstrain::zero
