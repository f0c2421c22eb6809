// AdamW over one flat fp32 shard, with torch.optim.AdamW's semantics (decoupled decay first, then
// moments, bias corrections from the incremented step). On CPU the update is one fused pass
// (adamw_kernel.cpp) split across ATen's intra-op threads; on CUDA one fused kernel per segment
// (kernels/adamw_cuda.h) when the build has the CUDA kernels; elsewhere ATen ops per segment
// (correct, not fused).

#include <cmath>

#include <ATen/Parallel.h>
#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "core/error.h"
#include "kernels/adamw_cuda.h"
#include "optim/adamw_kernel.h"
#include "optim/optimizer.h"
#include "optim/shard_checks.h"
#include "optim/shard_segments.h"

namespace dstrain::optim {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per task: large enough to amortize thread wake-ups

void validate(const AdamWOptions& o) {
  auto in_unit = [](double b) { return b >= 0.0 && b < 1.0; };
  if (!in_unit(o.beta1) || !in_unit(o.beta2)) {
    fail(ErrorKind::kConfig, "AdamW betas ({}, {}) must each be in [0, 1)", o.beta1, o.beta2);
  }
  if (!(o.eps > 0.0)) fail(ErrorKind::kConfig, "AdamW eps {} must be positive", o.eps);
  if (!(o.weight_decay >= 0.0)) {
    fail(ErrorKind::kConfig, "AdamW weight_decay {} must not be negative", o.weight_decay);
  }
}

class AdamW : public Optimizer {
 public:
  AdamW(int64_t numel, const AdamWOptions& options, torch::Device device)
      : numel_(numel),
        options_(options),
        device_(device),
        segments_(decay_segments(numel, options.no_decay)) {
    validate(options);
    auto zeros = torch::zeros({numel}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    state_["exp_avg"] = zeros;
    state_["exp_avg_sq"] = zeros.clone();
  }

  void begin_step(double lr) override {
    ++step_;
    scalars_ = scalars(lr);
    begun_ = true;
  }

  void update(torch::Tensor& params, const torch::Tensor& grads, int64_t offset,
              const torch::Tensor& compute_copy) override {
    if (!begun_) fail(ErrorKind::kInternal, "AdamW: update() before begin_step()");
    check_piece("AdamW", params, grads, offset, numel_, device_);
    check_compute_copy("AdamW", params, compute_copy);
    if (device_.is_cuda() && kernels::cuda_kernels_available()) {
      update_cuda(params, grads, offset, compute_copy);  // reads bfloat16 gradients itself
      return;
    }
    const torch::Tensor grads32 = grads.to(torch::kFloat);
    if (device_.is_cpu()) {
      update_cpu(params, grads32, offset);
    } else {
      update_aten(params, grads32, offset);
    }
    if (compute_copy.defined()) compute_copy.copy_(params);
  }

  int64_t step_count() const override { return step_; }
  std::map<std::string, torch::Tensor> state() const override { return state_; }
  void load_state(const std::map<std::string, torch::Tensor>& state, int64_t step_count) override {
    load_named_state("AdamW", state_, state, step_count);
    step_ = step_count;
  }

 private:
  AdamWScalars scalars(double lr) const {
    const double t = static_cast<double>(step_);
    AdamWScalars s;
    s.beta1 = static_cast<float>(options_.beta1);
    s.one_minus_beta1 = static_cast<float>(1.0 - options_.beta1);
    s.beta2 = static_cast<float>(options_.beta2);
    s.one_minus_beta2 = static_cast<float>(1.0 - options_.beta2);
    s.eps = static_cast<float>(options_.eps);
    s.decay_factor = static_cast<float>(1.0 - lr * options_.weight_decay);
    s.step_size = static_cast<float>(lr / (1.0 - std::pow(options_.beta1, t)));
    s.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(options_.beta2, t)));
    return s;
  }

  // The decay segments inside the piece [offset, offset + n), as positions in the piece, with the
  // step's scalars for each.
  template <typename Fn>
  void for_each_segment(int64_t offset, int64_t n, Fn&& fn) const {
    for_each_segment_in(segments_, offset, offset + n, [&](const Segment& seg) {
      AdamWScalars local = scalars_;
      if (!seg.decay) local.decay_factor = 1.0f;
      fn(seg.begin - offset, seg.end - seg.begin, local);
    });
  }

  void update_cpu(torch::Tensor& params, const torch::Tensor& grads, int64_t offset) {
    float* p = params.data_ptr<float>();
    const float* g = grads.data_ptr<float>();
    float* m = state_["exp_avg"].data_ptr<float>() + offset;
    float* v = state_["exp_avg_sq"].data_ptr<float>() + offset;
    at::parallel_for(0, params.numel(), kGrain, [&](int64_t begin, int64_t end) {
      for_each_segment(offset + begin, end - begin, [&](int64_t at, int64_t n, const auto& s) {
        const int64_t b = begin + at;
        adamw_update(p + b, g + b, m + b, v + b, n, s);
      });
    });
  }

  // One fused kernel launch per decay segment, on LibTorch's current stream of the shard's device:
  // the stream the gradient's producers ran on (whatever stream the caller made current), so the
  // update is ordered after them and before whatever the caller enqueues next.
  void update_cuda(torch::Tensor& params, const torch::Tensor& grads, int64_t offset,
                   const torch::Tensor& compute_copy) {
    kernels::CudaStream stream = nullptr;
#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
    stream = c10::cuda::getCurrentCUDAStream(params.device().index()).stream();
#endif
    for_each_segment(offset, params.numel(), [&](int64_t at, int64_t n, const auto& s) {
      kernels::AdamWBuffers b;
      b.param = params.data_ptr<float>() + at;
      b.exp_avg = state_["exp_avg"].data_ptr<float>() + offset + at;
      b.exp_avg_sq = state_["exp_avg_sq"].data_ptr<float>() + offset + at;
      if (grads.scalar_type() == torch::kBFloat16) {
        b.grad = grads.data_ptr<at::BFloat16>() + at;
        b.grad_type = kernels::GradType::kBFloat16;
      } else {
        b.grad = grads.data_ptr<float>() + at;
        b.grad_type = kernels::GradType::kFloat32;
      }
      if (compute_copy.defined()) {
        b.param_bf16 = reinterpret_cast<uint16_t*>(compute_copy.data_ptr<at::BFloat16>()) + at;
      }
      b.n = n;
      kernels::adamw_update_cuda(b, s, stream);
    });
  }

  void update_aten(torch::Tensor& params, const torch::Tensor& grads, int64_t offset) {
    for_each_segment(offset, params.numel(), [&](int64_t at, int64_t n, const auto& s) {
      auto p = params.narrow(0, at, n);
      auto g = grads.narrow(0, at, n);
      auto m = state_["exp_avg"].narrow(0, offset + at, n);
      auto v = state_["exp_avg_sq"].narrow(0, offset + at, n);
      if (s.decay_factor != 1.0f) p.mul_(s.decay_factor);
      m.mul_(s.beta1).add_(g, s.one_minus_beta1);
      v.mul_(s.beta2).addcmul_(g, g, s.one_minus_beta2);
      p.addcdiv_(m, v.sqrt().div_(s.bias2_sqrt).add_(s.eps), -s.step_size);
    });
  }

  int64_t numel_;
  AdamWOptions options_;
  torch::Device device_;
  std::vector<Segment> segments_;
  std::map<std::string, torch::Tensor> state_;  // "exp_avg", "exp_avg_sq": [numel] float32
  int64_t step_ = 0;
  AdamWScalars scalars_;  // of the step begun last
  bool begun_ = false;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(int64_t numel, const AdamWOptions& options,
                                      torch::Device device) {
  return std::make_unique<AdamW>(numel, options, device);
}

}  // namespace dstrain::optim
