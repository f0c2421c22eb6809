// SGD with momentum and (coupled, L2-style) weight decay, as torch.optim.SGD without dampening or
// Nesterov: d = g + wd·p (where decay applies); buf = d on the first step, else momentum·buf + d;
// p -= lr·buf. Written with ATen ops: it exists for tests and small runs, not for speed.

#include "core/error.h"
#include "optim/optimizer.h"
#include "optim/shard_checks.h"
#include "optim/shard_segments.h"

namespace dstrain::optim {
namespace {

class Sgd : public Optimizer {
 public:
  Sgd(int64_t numel, const SgdOptions& options, torch::Device device)
      : numel_(numel),
        options_(options),
        device_(device),
        segments_(decay_segments(numel, options.no_decay)) {
    if (!(options.momentum >= 0.0) || !(options.weight_decay >= 0.0)) {
      fail(ErrorKind::kConfig, "SGD momentum {} and weight_decay {} must not be negative",
           options.momentum, options.weight_decay);
    }
    if (options.momentum != 0.0) {
      state_["momentum_buffer"] =
          torch::zeros({numel}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    }
  }

  void begin_step(double lr) override {
    ++step_;
    lr_ = lr;
    begun_ = true;
  }

  void update(torch::Tensor& params, const torch::Tensor& grads, int64_t offset,
              const torch::Tensor& compute_copy) override {
    if (!begun_) fail(ErrorKind::kInternal, "SGD: update() before begin_step()");
    check_piece("SGD", params, grads, offset, numel_, device_);
    check_compute_copy("SGD", params, compute_copy);
    const int64_t numel = params.numel();
    torch::Tensor d = grads.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
    if (options_.weight_decay != 0.0) {
      for_each_segment_in(segments_, offset, offset + numel, [&](const Segment& seg) {
        if (!seg.decay) return;
        const int64_t n = seg.end - seg.begin;
        d.narrow(0, seg.begin - offset, n)
            .add_(params.narrow(0, seg.begin - offset, n), options_.weight_decay);
      });
    }
    if (options_.momentum != 0.0) {
      torch::Tensor buf = state_["momentum_buffer"].narrow(0, offset, numel);
      if (step_ == 1) {
        buf.copy_(d);
      } else {
        buf.mul_(options_.momentum).add_(d);
      }
      d = buf;
    }
    params.add_(d, -lr_);
    if (compute_copy.defined()) compute_copy.copy_(params);
  }

  int64_t step_count() const override { return step_; }
  std::map<std::string, torch::Tensor> state() const override { return state_; }
  void load_state(const std::map<std::string, torch::Tensor>& state, int64_t step_count) override {
    load_named_state("SGD", state_, state, step_count);
    step_ = step_count;
  }

 private:
  int64_t numel_;
  SgdOptions options_;
  torch::Device device_;
  std::vector<Segment> segments_;
  std::map<std::string, torch::Tensor> state_;  // "momentum_buffer": [numel] float32, if momentum
  int64_t step_ = 0;
  double lr_ = 0;  // of the step begun last
  bool begun_ = false;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(int64_t numel, const SgdOptions& options,
                                    torch::Device device) {
  return std::make_unique<Sgd>(numel, options, device);
}

}  // namespace dstrain::optim
