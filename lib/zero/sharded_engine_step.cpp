// ShardedEngine (stages 0-2): completing gradient communication for the step, the parameter
// refresh after the MasterState's update, memory accounting and loading state.
#include "core/trace.h"
#include "zero/grad_reducer.h"
#include "zero/sharded_engine.h"

namespace dstrain::zero {

NormShare ShardedEngine::prepare_step() {
  torch::NoGradGuard no_grad;
  reducer_->finish();  // during backward: the buckets still in flight are updated here
  if (master_->backward_update_armed()) {
    return master_->backward_update_share(partition_.buckets().size());
  }
  grad32_ = fp32_gradients();
  master_->finalize_gradients(grad32_);
  return {local_grad_sq(grad32_), master_->copies_sq(grad32_)};
}

StepResult ShardedEngine::reduce_norm(const NormShare& share) {
  return master_->reduce_norm(share.owned_sq, share.copies_sq);
}

void ShardedEngine::finish_step(const StepResult& result, double lr) {
  torch::NoGradGuard no_grad;
  if (grad32_.defined() && !result.skipped) {
    const torch::Tensor coef = master_->coefficient(result);
    master_->begin_update(lr);
    for (size_t b = partition_.buckets().size(); b-- > 0;) {
      const Range r = in_master(b);
      update_bucket(b, grad32_.narrow(0, r.begin, r.end - r.begin), coef);
    }
  }
  grad32_ = torch::Tensor();
  wait_for_params();
  zero_grad();
}

void ShardedEngine::update_reduced_bucket(size_t bucket) {
  torch::NoGradGuard no_grad;
  const trace::Span span("optimizer", "update bucket", {"bucket", static_cast<int64_t>(bucket)});
  const Range r = in_master(bucket);
  const torch::Tensor& grads = options_.stage == 0 ? flat_grad_ : grad_shard_;
  torch::Tensor grad =
      gradient_for_master(grads.narrow(0, r.begin, r.end - r.begin), master_->master().device());
  // The elements this rank owns (local_grad_sq's rule): at stage 0 its chunk of the bucket.
  Range mine{0, r.end - r.begin};
  if (options_.stage == 0) {
    const Range owned = partition_.owned(bucket, comm_.rank());
    mine = {owned.begin - r.begin, owned.end - r.begin};
  }
  const torch::Tensor copy = compute_copy_of(bucket);
  master_->backward_update(std::move(grad), r.begin, mine, copy);
  if (!copy.defined()) refresh_bucket(bucket);
}

Range ShardedEngine::in_master(size_t bucket) const {
  const Range flat = partition_.buckets()[bucket];
  if (options_.stage == 0) return flat;
  const int64_t begin = partition_.shard_offset(bucket);
  return {begin, begin + (flat.end - flat.begin) / partition_.world_size()};
}

void ShardedEngine::update_bucket(size_t bucket, torch::Tensor grad32, const torch::Tensor& coef) {
  const torch::Tensor copy = compute_copy_of(bucket);
  master_->update(std::move(grad32), in_master(bucket).begin, coef, copy);
  if (!copy.defined()) refresh_bucket(bucket);
}

torch::Tensor ShardedEngine::compute_copy_of(size_t bucket) const {
  const bool written_by_update = options_.stage == 0 && !master_->aliases_params() &&
                                 flat_params_.scalar_type() == torch::kBFloat16 &&
                                 flat_params_.device() == master_->master().device();
  if (!written_by_update) return torch::Tensor();
  const Range flat = partition_.buckets()[bucket];
  return flat_params_.narrow(0, flat.begin, flat.end - flat.begin);
}

// The reduced gradient in master coordinates as fp32, where the master lives: stage 0 the full
// flat buffer, stages 1/2 the shard (streamed to the host with offload_optimizer). In fp32 compute
// without offload this is the gradient buffer itself (scaled in place, zeroed afterwards).
torch::Tensor ShardedEngine::fp32_gradients() const {
  const torch::Tensor& grads = options_.stage == 0 ? flat_grad_ : grad_shard_;
  return grads.to(master_->master().device(), torch::kFloat32);
}

// Σ g² of the elements this rank owns, so that over all ranks each element counts once (at stage 0
// every rank holds the full averaged gradient, but owns only its chunks of it). Summed where the
// gradient is (the host with offload), in fp64 per chunk.
torch::Tensor ShardedEngine::local_grad_sq(const torch::Tensor& grad32) const {
  const auto f64 = grad32.options().dtype(torch::kFloat64);
  torch::Tensor total = torch::zeros({1}, f64);
  if (options_.stage == 0) {
    for (size_t b = 0; b < partition_.buckets().size(); ++b) {
      const Range mine = partition_.owned(b, comm_.rank());
      total += squared_norm(grad32.narrow(0, mine.begin, mine.end - mine.begin));
    }
  } else {
    total += squared_norm(grad32);
  }
  return total;
}

// Copies the updated master weights into the compute parameters (after loading state).
void ShardedEngine::refresh_params() {
  for (size_t b = partition_.buckets().size(); b-- > 0;) refresh_bucket(b);
  wait_for_params();
}

// One bucket's parameters from the master: a cast at stage 0 (nothing when they alias), the
// bucket's all-gather launched at stages 1/2 (completed by wait_for_params()); with offload the
// chunk is cast on the host and streamed back to the device as its input.
void ShardedEngine::refresh_bucket(size_t bucket) {
  if (master_->aliases_params()) return;
  const Range flat = partition_.buckets()[bucket];
  const Range mine = in_master(bucket);
  torch::Tensor input = master_->master().narrow(0, mine.begin, mine.end - mine.begin);
  torch::Tensor output = flat_params_.narrow(0, flat.begin, flat.end - flat.begin);
  if (options_.stage == 0) {
    output.copy_(input);
    return;
  }
  input = input.to(flat_params_.device(), flat_params_.scalar_type());
  const trace::ScopedLabel label("bucket", static_cast<int64_t>(bucket));
  gathers_.push_back(comm_.all_gather(output, input));
  gather_buffers_.push_back(input);
  gather_buffers_.push_back(output);
}

void ShardedEngine::wait_for_params() {
  if (gathers_.empty()) return;
  const trace::Span span("comm", "wait for parameters");
  for (auto& work : gathers_) work->wait();
  gathers_.clear();
  gather_buffers_.clear();
}

void ShardedEngine::zero_grad() {
  if (flat_grad_.defined()) flat_grad_.zero_();
  if (options_.stage == 2) {
    grad_shard_.zero_();
  } else if (options_.stage == 1) {
    grad_shard_ = torch::Tensor();
    reducer_->set_grad_shard(grad_shard_);
  }
}

void ShardedEngine::do_discard() {
  torch::NoGradGuard no_grad;
  reducer_->finish();  // stage 2 reduces on every micro-step: wait for what is in flight
  zero_grad();
}

void ShardedEngine::do_load_state(const StateSource& source, int64_t step_count,
                                  const LossScalerState& scaler) {
  torch::NoGradGuard no_grad;
  master_->load_state(source, step_count, scaler);
  refresh_params();
  zero_grad();
}

MemoryReport ShardedEngine::bytes() const {
  MemoryReport report;
  report.compute_params = flat_params_.nbytes();
  if (flat_grad_.defined()) report.gradients += flat_grad_.nbytes();
  if (grad_shard_.defined()) report.gradients += grad_shard_.nbytes();
  report.master_weights = master_->master_bytes();
  report.optimizer_state = master_->optimizer_bytes();
  report.comm_buffers = reducer_->held_bytes();
  report.comm_buffers_peak = reducer_->peak_bytes();
  // Counted by intent, as at stage 3: on a CPU-only machine host and device are one memory.
  if (options_.offload_optimizer) {
    report.host_bytes = report.master_weights + report.optimizer_state;
    if (grad_shard_.defined()) report.host_bytes += grad_shard_.nbytes();  // fp32 on the host
  }
  return report;
}

}  // namespace dstrain::zero
