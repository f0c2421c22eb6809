// Engine::step(): completing gradient communication, global-norm clipping, fp16 overflow handling,
// the optimizer update and the parameter refresh.
#include <cmath>

#include "core/error.h"
#include "zero/engine.h"
#include "zero/grad_reducer.h"
#include "zero/stage3.h"

namespace dstrain::zero {

double gradient_coefficient(const StepResult& r, double clip) {
  double coef = 1.0 / r.loss_scale;
  if (clip > 0 && r.grad_norm > clip) coef *= clip / (r.grad_norm + 1e-6);
  return coef;
}

StepResult Engine::step(double lr) {
  if (stage3_) return stage3_->step(lr);
  if (micro_step_ != options_.gradient_accumulation_steps) {
    fail(ErrorKind::kInternal, "zero engine: step() after {} of {} backward() calls", micro_step_,
         options_.gradient_accumulation_steps);
  }
  torch::NoGradGuard no_grad;
  reducer_->finish();
  StepResult result;
  result.loss_scale = scaler_.scale();
  torch::Tensor grad32 = fp32_gradients();
  const double sq = global_grad_sq(grad32);
  result.grad_norm = std::sqrt(sq) / result.loss_scale;
  result.skipped = scaler_.update(!std::isfinite(sq));
  if (!result.skipped) {
    const double coef = gradient_coefficient(result, options_.gradient_clipping);
    if (coef != 1.0) grad32.mul_(coef);
    optimizer_->step(master_, grad32, lr);
    grad32 = torch::Tensor();
    refresh_params();
  }
  zero_grad();
  micro_step_ = 0;
  return result;
}

// The reduced gradient in master coordinates as fp32, where the master lives: stage 0 the full
// flat buffer, stages 1/2 the shard (streamed to the host with offload_optimizer). In fp32 compute
// without offload this is the gradient buffer itself (scaled in place, zeroed afterwards).
torch::Tensor Engine::fp32_gradients() {
  const torch::Tensor& grads = options_.stage == 0 ? flat_grad_ : grad_shard_;
  return grads.to(master_.device(), torch::kFloat32);
}

// Σ g² over all ranks, each element counted once: a rank sums only the chunks it owns (at stage 0
// every rank holds the full averaged gradient, but owns only its chunks of it).
double Engine::global_grad_sq(const torch::Tensor& grad32) {
  // Summed where the gradient is (the host with offload), all-reduced on the communicator's device.
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
  // One device sync per step (item() below), none per bucket.
  total = total.to(flat_params_.device());
  comm_.all_reduce(total, comm::ReduceOp::kSum)->wait();
  return total.item<double>();
}

// Copies the updated master weights into the compute parameters: a cast at stage 0 (nothing when
// they alias), one all-gather per bucket at stages 1/2 (all launched, then all completed); with
// offload each bucket's chunk is cast on the host and streamed back to the device as its input.
void Engine::refresh_params() {
  if (master_aliases_params_) return;
  if (options_.stage == 0) {
    flat_params_.copy_(master_);
    return;
  }
  std::vector<std::unique_ptr<comm::Work>> works;
  std::vector<torch::Tensor> keep;
  for (size_t b = 0; b < partition_.buckets().size(); ++b) {
    const Range flat = partition_.buckets()[b];
    const int64_t chunk = (flat.end - flat.begin) / partition_.world_size();
    torch::Tensor input = master_.narrow(0, partition_.shard_offset(b), chunk);
    input = input.to(flat_params_.device(), flat_params_.scalar_type());
    torch::Tensor output = flat_params_.narrow(0, flat.begin, flat.end - flat.begin);
    works.push_back(comm_.all_gather(output, input));
    keep.push_back(input);
    keep.push_back(output);
  }
  for (auto& work : works) work->wait();
}

void Engine::zero_grad() {
  if (flat_grad_.defined()) flat_grad_.zero_();
  if (options_.stage == 2) {
    grad_shard_.zero_();
  } else if (options_.stage == 1) {
    grad_shard_ = torch::Tensor();
    reducer_->set_grad_shard(grad_shard_);
  }
}

}  // namespace dstrain::zero
