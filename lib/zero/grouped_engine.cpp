#include "zero/grouped_engine.h"

#include "core/error.h"

namespace dstrain::zero {

GroupedEngine::GroupedEngine(std::vector<std::unique_ptr<Engine>> parts)
    : parts_(std::move(parts)) {
  if (parts_.empty()) fail(ErrorKind::kInternal, "zero engine: a group of no engines");
}

void GroupedEngine::pre_forward(size_t segment) {
  for (auto& part : parts_) part->pre_forward(segment);
}

void GroupedEngine::post_forward(size_t segment, const torch::Tensor& output) {
  for (auto& part : parts_) part->post_forward(segment, output);
}

bool GroupedEngine::can_update_during_backward() const {
  for (const auto& part : parts_) {
    if (!part->can_update_during_backward()) return false;
  }
  return true;
}

MemoryReport GroupedEngine::bytes() const {
  MemoryReport sum;
  for (const auto& part : parts_) {
    const MemoryReport r = part->bytes();
    sum.compute_params += r.compute_params;
    sum.gradients += r.gradients;
    sum.master_weights += r.master_weights;
    sum.optimizer_state += r.optimizer_state;
    sum.comm_buffers += r.comm_buffers;
    sum.comm_buffers_peak += r.comm_buffers_peak;  // an upper bound: the peaks may not coincide
    sum.gathered_params += r.gathered_params;
    sum.gathered_params_peak += r.gathered_params_peak;
    sum.persistent_params += r.persistent_params;
    sum.host_bytes += r.host_bytes;
  }
  return sum;
}

std::vector<StatePiece> GroupedEngine::owned_state() const {
  std::vector<StatePiece> out;
  for (const auto& part : parts_) {
    for (StatePiece& piece : part->owned_state()) out.push_back(std::move(piece));
  }
  return out;
}

void GroupedEngine::before_autograd(MicroStep micro) {
  for (auto& part : parts_) {
    part->step_lr_ = step_lr();
    part->before_autograd(micro);
  }
}

void GroupedEngine::after_autograd() {
  for (auto& part : parts_) part->after_autograd();
}

NormShare GroupedEngine::prepare_step() {
  NormShare sum;
  for (auto& part : parts_) {
    const NormShare share = part->prepare_step();
    sum.owned_sq = sum.owned_sq.defined() ? sum.owned_sq + share.owned_sq.to(sum.owned_sq.device())
                                          : share.owned_sq;
    if (!share.copies_sq.defined()) continue;
    sum.copies_sq = sum.copies_sq.defined()
                        ? sum.copies_sq + share.copies_sq.to(sum.copies_sq.device())
                        : share.copies_sq;
  }
  return sum;
}

StepResult GroupedEngine::reduce_norm(const NormShare& share) {
  return parts_.front()->reduce_norm(share);
}

void GroupedEngine::finish_step(const StepResult& result, double lr) {
  for (auto& part : parts_) {
    part->finish_step(result, lr);
    part->step_lr_.reset();
  }
}

void GroupedEngine::do_load_state(const StateSource& source, int64_t step_count,
                                  const LossScalerState& scaler) {
  for (auto& part : parts_) part->load_state(source, step_count, scaler);
}

void GroupedEngine::do_discard() {
  for (auto& part : parts_) part->discard_micro_steps();
}

}  // namespace dstrain::zero
