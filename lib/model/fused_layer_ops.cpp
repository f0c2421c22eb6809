#include "model/fused_layer_ops.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "core/error.h"
#include "kernels/fused_ops.h"
#include "model/rope.h"

namespace dstrain::model {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool kernels_switched_on() {
  static const bool on = [] {
    const char* value = std::getenv("DSTRAIN_CUDA_KERNELS");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return on;
}

kernels::ElementType element_type(const Tensor& x) {
  return x.scalar_type() == torch::kBFloat16 ? kernels::ElementType::kBFloat16
                                             : kernels::ElementType::kFloat32;
}

#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
kernels::CudaStream stream_of(const Tensor& x) {
  return c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
}

void launch_cross_entropy(const kernels::CrossEntropyArgs& a, const Tensor& logits) {
  const c10::cuda::CUDAGuard on_device(logits.device());
  kernels::cross_entropy_cuda(a, stream_of(logits));
}

#else  // a LibTorch without CUDA: use_fused_kernels() is false, so this is never called

void launch_cross_entropy(const kernels::CrossEntropyArgs&, const Tensor&) {
  fail(ErrorKind::kInternal, "fused kernels called in a build without CUDA");
}

#endif

// One of the kernels on x's device: `cuda` for a CUDA tensor, its CPU `reference` otherwise.
template <typename Args>
void run_on_device_of(const Tensor& x, const Args& a,
                      void (*cuda)(const Args&, kernels::CudaStream),
                      void (*reference)(const Args&)) {
#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
  if (x.is_cuda()) {
    const c10::cuda::CUDAGuard on_device(x.device());
    cuda(a, stream_of(x));
    return;
  }
#else
  (void)cuda;
#endif
  reference(a);
}

// x [B, T, H, D] (last dimension contiguous) → a new contiguous [B, T, H, D].
Tensor rope_kernel(Tensor x, const Tensor& cos, const Tensor& sin, bool inverse) {
  if (x.stride(3) != 1) x = x.contiguous();
  Tensor out = torch::empty(x.sizes(), x.options());
  run_on_device_of(x, rope_args(x, out, cos, sin, inverse), kernels::rope_cuda,
                   kernels::rope_reference);
  return out;
}

struct Rotary : torch::autograd::Function<Rotary> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& cos,
                        const Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rope_kernel(x, cos, sin, /*inverse=*/false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    return {rope_kernel(grads[0], saved[0], saved[1], /*inverse=*/true), Tensor(), Tensor()};
  }
};

struct Swiglu : torch::autograd::Function<Swiglu> {
  static Tensor forward(AutogradContext* ctx, const Tensor& gate, const Tensor& up) {
    const Tensor g = gate.contiguous(), u = up.contiguous();
    ctx->save_for_backward({g, u});
    Tensor out = torch::empty(g.sizes(), g.options());
    run_on_device_of(
        g,
        kernels::SwigluArgs{g.data_ptr(), u.data_ptr(), out.data_ptr(), g.numel(), element_type(g)},
        kernels::swiglu_cuda, kernels::swiglu_reference);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor& g = saved[0];
    const Tensor grad = grads[0].contiguous();
    Tensor grad_gate = torch::empty(g.sizes(), g.options());
    Tensor grad_up = torch::empty(g.sizes(), g.options());
    run_on_device_of(g,
                     kernels::SwigluBackwardArgs{grad.data_ptr(), g.data_ptr(), saved[1].data_ptr(),
                                                 grad_gate.data_ptr(), grad_up.data_ptr(),
                                                 g.numel(), element_type(g)},
                     kernels::swiglu_backward_cuda, kernels::swiglu_backward_reference);
    return {grad_gate, grad_up};
  }
};

// Inputs x, delta (same shape and dtype, last dimension `hidden`) and weight [hidden]; outputs
// {sum, normed}. Saves the sum, the weight and the rows' rstd.
struct AddRmsNorm : torch::autograd::Function<AddRmsNorm> {
  static variable_list forward(AutogradContext* ctx, const Tensor& x, const Tensor& delta,
                               const Tensor& weight, double eps) {
    const Tensor xc = x.contiguous(), dc = delta.contiguous(), w = weight.contiguous();
    Tensor sum = torch::empty(xc.sizes(), xc.options());
    Tensor out = torch::empty(xc.sizes(), xc.options());
    const int64_t hidden = xc.size(-1), rows = xc.numel() / hidden;
    Tensor rstd = torch::empty({rows}, xc.options().dtype(torch::kFloat));
    kernels::AddRmsNormArgs a;
    a.x = xc.data_ptr();
    a.delta = dc.data_ptr();
    a.weight = w.data_ptr();
    a.sum = sum.data_ptr();
    a.out = out.data_ptr();
    a.rstd = rstd.data_ptr<float>();
    a.rows = rows;
    a.hidden = hidden;
    a.eps = static_cast<float>(eps);
    a.type = element_type(xc);
    run_on_device_of(xc, a, kernels::add_rms_norm_cuda, kernels::add_rms_norm_reference);
    ctx->save_for_backward({sum, w, rstd});
    return {sum, out};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &sum = saved[0], &w = saved[1], &rstd = saved[2];
    if (!grads[1].defined()) return {grads[0], grads[0], Tensor(), Tensor()};
    const Tensor grad_out = grads[1].contiguous();
    const Tensor grad_sum = grads[0].defined() ? grads[0].contiguous() : Tensor();
    const int64_t hidden = sum.size(-1), rows = sum.numel() / hidden;
    Tensor grad_in = torch::empty(sum.sizes(), sum.options());
    Tensor grad_weight, workspace;
    if (ctx->needs_input_grad(2)) {
      grad_weight = torch::empty({hidden}, w.options());
      workspace = torch::empty({kernels::add_rms_norm_workspace(rows, hidden)},
                               sum.options().dtype(torch::kFloat));
    }
    kernels::AddRmsNormBackwardArgs a;
    a.grad_out = grad_out.data_ptr();
    a.grad_sum = grad_sum.defined() ? grad_sum.data_ptr() : nullptr;
    a.sum = sum.data_ptr();
    a.weight = w.data_ptr();
    a.rstd = rstd.data_ptr<float>();
    a.grad_in = grad_in.data_ptr();
    a.grad_weight = grad_weight.defined() ? grad_weight.data_ptr() : nullptr;
    a.workspace = workspace.defined() ? workspace.data_ptr<float>() : nullptr;
    a.rows = rows;
    a.hidden = hidden;
    a.type = element_type(sum);
    run_on_device_of(sum, a, kernels::add_rms_norm_backward_cuda,
                     kernels::add_rms_norm_backward_reference);
    return {grad_in, grad_in, grad_weight, Tensor()};
  }
};

}  // namespace

kernels::RopeArgs rope_args(const Tensor& x, const Tensor& out, const Tensor& cos,
                            const Tensor& sin, bool inverse) {
  kernels::RopeArgs a;
  a.x = x.data_ptr();
  a.out = out.data_ptr();
  a.cos = cos.data_ptr();
  a.sin = sin.data_ptr();
  a.batch = x.size(0);
  a.seq_len = x.size(1);
  a.heads = x.size(2);
  a.dim = x.size(3);
  a.batch_stride = x.stride(0);
  a.seq_stride = x.stride(1);
  a.head_stride = x.stride(2);
  a.type = element_type(x);
  a.inverse = inverse;
  return a;
}

Tensor fused_cross_entropy(Tensor& logits, const Tensor& labels, int64_t ignore_index, bool grad) {
  const Tensor y = labels.contiguous();
  Tensor rows = torch::empty({logits.size(0)}, logits.options().dtype(torch::kFloat));
  kernels::CrossEntropyArgs a;
  a.logits = logits.data_ptr();
  a.labels = y.data_ptr<int64_t>();
  a.loss = rows.data_ptr<float>();
  a.rows = logits.size(0);
  a.vocab = logits.size(1);
  a.ignore_index = ignore_index;
  a.type = element_type(logits);
  a.write_grad = grad;
  launch_cross_entropy(a, logits);
  return rows;
}

namespace {
std::atomic<bool> path_on[kFusedPathCount] = {true, true, true, true, true, true, true};
}  // namespace

const char* fused_path_name(FusedPath path) {
  switch (path) {
    case FusedPath::kAddRmsNorm:
      return "add + RMSNorm";
    case FusedPath::kAddProjection:
      return "add after down_proj";
    case FusedPath::kQkv:
      return "q/k/v projection";
    case FusedPath::kRotary:
      return "rotary embedding";
    case FusedPath::kSwiglu:
      return "SwiGLU";
    case FusedPath::kVarlenAttention:
      return "packed documents' attention";
    case FusedPath::kGroupedExperts:
      return "grouped expert product";
  }
  return "?";
}

bool fused_path_on(FusedPath path) {
  return path_on[static_cast<int>(path)].load();
}

void set_fused_path_on(FusedPath path, bool on) {
  path_on[static_cast<int>(path)].store(on);
}

bool use_fused_kernels(const Tensor& x) {
  return x.is_cuda() && (x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16) &&
         kernels::cuda_kernels_available() && kernels_switched_on();
}

Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  if (use_fused_kernels(x) && weight.scalar_type() == x.scalar_type()) {
    return std::get<0>(at::_fused_rms_norm(x, {x.size(-1)}, weight, eps));
  }
  const Tensor xf = x.to(torch::kFloat);
  const Tensor normed = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

std::pair<Tensor, Tensor> add_rms_norm_kernels(const Tensor& x, const Tensor& delta,
                                               const Tensor& weight, double eps) {
  const variable_list outs = AddRmsNorm::apply(x, delta, weight, eps);
  return {outs[0], outs[1]};
}

std::pair<Tensor, Tensor> add_rms_norm(const Tensor& x, const Tensor& delta, const Tensor& weight,
                                       double eps) {
  const int64_t hidden = x.size(-1);
  if (use_fused_kernels(x) && fused_path_on(FusedPath::kAddRmsNorm) &&
      delta.scalar_type() == x.scalar_type() && delta.sizes() == x.sizes() &&
      weight.scalar_type() == x.scalar_type() && weight.dim() == 1 && weight.size(0) == hidden &&
      hidden <= kernels::kAddRmsNormMaxHidden) {
    return add_rms_norm_kernels(x, delta, weight, eps);
  }
  Tensor sum = x + delta;
  Tensor normed = rms_norm(sum, weight, eps);
  return {std::move(sum), std::move(normed)};
}

Tensor add_projection(const Tensor& residual, const Tensor& x, const Tensor& weight) {
  if (use_fused_kernels(x) && fused_path_on(FusedPath::kAddProjection) &&
      residual.scalar_type() == x.scalar_type() && weight.scalar_type() == x.scalar_type() &&
      residual.size(-1) == weight.size(0)) {
    return add_projection_epilogue(residual, x, weight);
  }
  return residual + at::linear(x, weight);
}

Tensor add_projection_epilogue(const Tensor& residual, const Tensor& x, const Tensor& weight) {
  const int64_t in = x.size(-1), out = weight.size(0);
  return at::addmm(residual.reshape({-1, out}), x.reshape({-1, in}), weight.t())
      .view(residual.sizes());
}

Tensor rotary(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  if (cos.dim() == 3) {  // per token (packed documents)
    if (use_fused_kernels(x) && fused_path_on(FusedPath::kRotary) &&
        cos.scalar_type() == x.scalar_type() && x.stride(0) == x.size(1) * x.stride(1)) {
      return rotary_kernels_per_token(x, cos, sin);
    }
    return apply_rope(x, cos.unsqueeze(2), sin.unsqueeze(2));
  }
  if (use_fused_kernels(x) && fused_path_on(FusedPath::kRotary) &&
      cos.scalar_type() == x.scalar_type()) {
    return rotary_kernels(x, cos, sin);
  }
  return apply_rope(x, cos.unsqueeze(1), sin.unsqueeze(1));
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  if (use_fused_kernels(gate) && fused_path_on(FusedPath::kSwiglu) &&
      up.scalar_type() == gate.scalar_type() && up.sizes() == gate.sizes()) {
    return swiglu_kernels(gate, up);
  }
  return torch::silu(gate) * up;
}

Tensor rotary_kernels(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  return Rotary::apply(x, cos.contiguous(), sin.contiguous());
}

Tensor rotary_kernels_per_token(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  if (x.stride(0) != T * x.stride(1) || cos.dim() != 3) {
    fail(ErrorKind::kInternal, "rotary_kernels_per_token: x {} strides {}, tables {}",
         c10::str(x.sizes()), c10::str(x.strides()), c10::str(cos.sizes()));
  }
  // The rows as one sequence of B·T tokens, the tables as one [B·T, D] table.
  return rotary_kernels(x.view({1, B * T, H, D}), cos.reshape({B * T, D}), sin.reshape({B * T, D}))
      .view({B, T, H, D});
}

Tensor swiglu_kernels(const Tensor& gate, const Tensor& up) {
  return Swiglu::apply(gate, up);
}

}  // namespace dstrain::model
