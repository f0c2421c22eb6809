// Stage 3: gathering units around forward segments and their backward, reduce-scattering gradients
// as units complete. See stage3_engine.h for the schedule.
#include <algorithm>

#include <torch/csrc/autograd/grad_mode.h>

#include "core/error.h"
#include "core/trace.h"
#include "model/storage.h"
#include "zero/stage3_engine.h"

namespace dstrain::zero {

void Stage3Engine::launch_gather(size_t u) {
  Unit& unit = units_[u];
  if (unit.state != UnitState::kFree || unit.partition.padded_numel() == 0) return;
  if (unit.current) {
    unit.state = UnitState::kGathered;
    return;
  }
  model::allocate_storage(unit.full, unit.full.numel() * unit.full.element_size());
  // The chunk this rank contributes; with offload_param it is copied from the host first.
  torch::Tensor input = shard_of(unit, unit.frozen() ? frozen_shard_ : param_shard_);
  if (input.device() != device_) input = input.to(device_, /*non_blocking=*/true);
  unit.gather_input = input;
  const trace::ScopedLabel label("unit", static_cast<int64_t>(u));
  unit.gather = comm_.all_gather(unit.full, unit.gather_input);
  unit.state = UnitState::kGathering;
  note_gathered();
}

void Stage3Engine::wait_gathered(size_t u) {
  Unit& unit = units_[u];
  if (unit.state == UnitState::kFree) launch_gather(u);
  if (unit.state != UnitState::kGathering) return;
  const trace::Span span("comm", "wait for unit", {"unit", static_cast<int64_t>(u)});
  unit.gather->wait();
  unit.gather.reset();
  unit.gather_input = torch::Tensor();
  unit.state = UnitState::kGathered;
  unit.current = options_.keep_gathered_memory;
}

void Stage3Engine::stale_trainable_units() {
  for (Unit& unit : units_) {
    if (!unit.frozen()) unit.current = false;
  }
}

void Stage3Engine::release(size_t u) {
  Unit& unit = units_[u];
  if (unit.persistent() || unit.state == UnitState::kFree) return;
  if (unit.state == UnitState::kGathering) wait_gathered(u);
  if (!options_.keep_gathered_memory) model::release_storage(unit.full);
  unit.state = UnitState::kFree;
}

// Starts the gathers of the segments after `segment` in `direction` (+1 forward, -1 backward)
// while their units fit in prefetch_bucket_size elements. Units ahead that are already gathered or
// gathering count against the budget too: it bounds what is held ahead of use, not what is started
// per call (else each segment would start another budget's worth and most of the model would end
// up gathered).
void Stage3Engine::prefetch_after(size_t segment, int direction) {
  int64_t budget = options_.prefetch_bucket_size;
  const auto count = static_cast<int64_t>(options_.segments.size());
  for (int64_t k = static_cast<int64_t>(segment) + direction; k >= 0 && k < count; k += direction) {
    for (int u : options_.segments[static_cast<size_t>(k)]) {
      Unit& unit = units_[static_cast<size_t>(u)];
      if (unit.reduced || unit.persistent()) continue;
      budget -= unit.partition.padded_numel();
      if (budget < 0) return;
      if (unit.state == UnitState::kFree) launch_gather(static_cast<size_t>(u));
    }
  }
}

void Stage3Engine::pre_forward(size_t segment) {
  if (segment >= options_.segments.size()) {
    fail(ErrorKind::kInternal, "zero engine: forward segment {} of {}", segment,
         options_.segments.size());
  }
  for (int u : options_.segments[segment]) wait_gathered(static_cast<size_t>(u));
  prefetch_after(segment, +1);
}

void Stage3Engine::post_forward(size_t segment, const torch::Tensor& output) {
  const auto& units = options_.segments[segment];
  const bool last = segment + 1 == options_.segments.size();
  for (int u : units) {
    const auto& next = last ? std::vector<int>{} : options_.segments[segment + 1];
    if (std::find(next.begin(), next.end(), u) == next.end()) release(static_cast<size_t>(u));
  }
  if (torch::GradMode::is_enabled() && output.requires_grad()) {
    // Fires when the gradient of `output` is complete: just before the segment's backward.
    output.register_hook([this, segment](const torch::Tensor&) { pre_backward(segment); });
  }
}

void Stage3Engine::pre_backward(size_t segment) {
  release_frozen_after(segment);
  for (int u : options_.segments[segment]) {
    if (!units_[static_cast<size_t>(u)].reduced) wait_gathered(static_cast<size_t>(u));
  }
  prefetch_after(segment, -1);
}

// The gradient of segment k's output is complete, so segment k+1's backward is over: its frozen
// units (which no gradient hook reports) are not needed any more unless segment k reads them.
void Stage3Engine::release_frozen_after(size_t segment) {
  if (segment + 1 >= options_.segments.size()) return;
  const auto& current = options_.segments[segment];
  for (int u : options_.segments[segment + 1]) {
    if (!units_[static_cast<size_t>(u)].frozen()) continue;
    if (std::find(current.begin(), current.end(), u) == current.end()) {
      release(static_cast<size_t>(u));
    }
  }
}

// A parameter's gradient is final for this backward: keep it in the unit's transient buffer; once
// the whole unit has reported, reduce-scatter it and release the unit.
void Stage3Engine::on_grad_ready(size_t param) {
  if (!in_backward_) return;
  const size_t u = unit_of_[param];
  Unit& unit = units_[u];
  torch::Tensor& grad = params_[param].tensor.mutable_grad();
  if (!unit.grad_full.defined()) {
    unit.grad_full = torch::zeros({unit.partition.padded_numel()}, compute_options());
    note_gathered();
  }
  const auto k = static_cast<size_t>(std::find(unit.params.begin(), unit.params.end(), param) -
                                     unit.params.begin());
  if (grad.defined()) {
    unit.grad_full.narrow(0, unit.partition.param_offset(k), unit.partition.param_numel(k))
        .copy_(grad.reshape({-1}));
  }
  grad = torch::Tensor();
  if (--unit.waiting == 0) reduce_unit(u);
}

void Stage3Engine::reduce_unit(size_t u) {
  Unit& unit = units_[u];
  unit.reduced = true;
  if (unit.partition.padded_numel() == 0) return;
  if (!unit.grad_full.defined()) {
    unit.grad_full = torch::zeros({unit.partition.padded_numel()}, compute_options());
  }
  if (in_flight_.size() >= 2) retire_oldest();
  Reduction r;
  r.input = std::move(unit.grad_full);
  r.output = torch::empty({unit.partition.shard_numel()}, compute_options());
  r.target = shard_of(unit, grad_shard_);
  r.unit = u;
  r.update = master_->backward_update_armed();
  const trace::ScopedLabel label("unit", static_cast<int64_t>(u));
  r.work = comm_.reduce_scatter(r.output, r.input, comm::ReduceOp::kAvg);
  in_flight_.push_back(std::move(r));
  release(u);
}

void Stage3Engine::retire_oldest() {
  Reduction r = std::move(in_flight_.front());
  in_flight_.pop_front();
  const trace::Span span("comm", "wait for reduce_scatter");
  r.work->wait();
  // With offload the target is the host's fp32 shard: the chunk streams there now.
  if (r.target.device() != r.output.device() || r.target.dtype() != r.output.dtype()) {
    r.output = r.output.to(r.target.device(), r.target.scalar_type());
  }
  r.target.add_(r.output);
  if (r.update) update_unit(r.unit);
}

void Stage3Engine::update_unit(size_t u) {
  torch::NoGradGuard no_grad;
  const trace::Span span("optimizer", "update unit", {"unit", static_cast<int64_t>(u)});
  Unit& unit = units_[u];
  unit.current = false;
  torch::Tensor grad = gradient_for_master(shard_of(unit, grad_shard_), master_->master().device());
  const int64_t n = grad.numel();
  // A bf16 parameter shard beside the master is written by the optimizer's update itself.
  const bool copy_in_update = !master_->aliases_params() &&
                              param_shard_.scalar_type() == torch::kBFloat16 &&
                              param_shard_.device() == master_->master().device();
  master_->backward_update(std::move(grad), unit.shard_offset, {0, n},
                           copy_in_update ? shard_of(unit, param_shard_) : torch::Tensor());
  if (!master_->aliases_params() && !copy_in_update) {
    shard_of(unit, param_shard_).copy_(shard_of(unit, master_->master()));
  }
}

// Every micro-step alike: each unit's reduce-scatter is added into the gradient shard.
void Stage3Engine::before_autograd(MicroStep micro) {
  master_->arm_backward_update(micro.last() ? step_lr() : std::nullopt);
  for (Unit& unit : units_) {
    unit.waiting = static_cast<int>(unit.params.size());
    unit.reduced = false;
  }
  in_backward_ = true;
}

// Units whose parameters got no gradient (all ranks alike) are reduced as zeros, in descending
// order; then every collective completes and every non-persistent unit is released.
void Stage3Engine::finish_backward() {
  torch::NoGradGuard no_grad;
  in_backward_ = false;
  for (size_t u = units_.size(); u-- > 0;) {
    if (!units_[u].reduced && !units_[u].frozen()) reduce_unit(u);
  }
  while (!in_flight_.empty()) retire_oldest();
  for (size_t u = 0; u < units_.size(); ++u) {
    release(u);
    units_[u].reduced = false;
  }
}

int64_t Stage3Engine::gathered_bytes() const {
  int64_t bytes = 0;
  for (const Unit& unit : units_) {
    if (!unit.persistent()) bytes += model::storage_bytes(unit.full);
    if (unit.grad_full.defined()) bytes += unit.grad_full.nbytes();
  }
  for (const Reduction& r : in_flight_) bytes += r.input.nbytes() + r.output.nbytes();
  return bytes;
}

void Stage3Engine::note_gathered() {
  gathered_peak_ = std::max(gathered_peak_, gathered_bytes());
}

}  // namespace dstrain::zero
