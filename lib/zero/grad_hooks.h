#pragma once
// Knowing when a parameter's gradient is final for this backward.
//
// A tensor hook (Tensor::register_hook) fires before autograd accumulates the gradient into .grad,
// so it cannot tell that .grad is complete. The gradient accumulator node of a leaf runs post hooks
// after it has written .grad: that is the point at which a bucket can count the parameter as ready.
// LibTorch 2.x offers register_post_accumulate_grad_hook for the same; this is the one place that
// knows.
//
// The accumulator node is owned weakly by the tensor: unless someone holds it, it is rebuilt on the
// next backward and the hook is lost. The returned handle holds it; keep it as long as the hook.
// Register after any set_data() that changes dtype or device (set_data drops the accumulator then).

#include <functional>
#include <memory>

#include <torch/types.h>

namespace torch::autograd {
struct Node;
}

namespace dstrain::zero {

using AccumulatorHandle = std::shared_ptr<torch::autograd::Node>;

// Calls `on_grad_ready()` each time autograd has accumulated a gradient into `param.grad()`.
// `param` must be a leaf that requires grad. The callback runs on the autograd thread.
AccumulatorHandle add_post_accumulate_hook(const torch::Tensor& param,
                                           std::function<void()> on_grad_ready);

}  // namespace dstrain::zero
