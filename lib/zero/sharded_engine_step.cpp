// ShardedEngine (stages 0-2): completing gradient communication for the step, the parameter
// refresh after the MasterState's update, memory accounting and loading state.
#include "core/trace.h"
#include "zero/grad_reducer.h"
#include "zero/sharded_engine.h"

namespace dstrain::zero {

StepResult ShardedEngine::do_step(double lr) {
  torch::NoGradGuard no_grad;
  reducer_->finish();
  torch::Tensor grad32 = fp32_gradients();
  const torch::Tensor sq = local_grad_sq(grad32);
  const StepResult result = master_->step(std::move(grad32), sq, lr);
  if (!result.skipped) refresh_params();
  zero_grad();
  return result;
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
      total += grad32.narrow(0, mine.begin, mine.end - mine.begin).pow(2).sum().to(torch::kFloat64);
    }
  } else {
    total += grad32.pow(2).sum().to(torch::kFloat64);
  }
  return total;
}

// Copies the updated master weights into the compute parameters: a cast at stage 0 (nothing when
// they alias), one all-gather per bucket at stages 1/2 (all launched, then all completed); with
// offload each bucket's chunk is cast on the host and streamed back to the device as its input.
void ShardedEngine::refresh_params() {
  if (master_->aliases_params()) return;
  const torch::Tensor& master = master_->master();
  if (options_.stage == 0) {
    flat_params_.copy_(master);
    return;
  }
  std::vector<std::unique_ptr<comm::Work>> works;
  std::vector<torch::Tensor> keep;
  for (size_t b = 0; b < partition_.buckets().size(); ++b) {
    const Range flat = partition_.buckets()[b];
    const int64_t chunk = (flat.end - flat.begin) / partition_.world_size();
    torch::Tensor input = master.narrow(0, partition_.shard_offset(b), chunk);
    input = input.to(flat_params_.device(), flat_params_.scalar_type());
    torch::Tensor output = flat_params_.narrow(0, flat.begin, flat.end - flat.begin);
    const trace::ScopedLabel label("bucket", static_cast<int64_t>(b));
    works.push_back(comm_.all_gather(output, input));
    keep.push_back(input);
    keep.push_back(output);
  }
  const trace::Span span("comm", "wait for parameters");
  for (auto& work : works) work->wait();
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
