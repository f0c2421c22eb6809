#include "zero/grad_hooks.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "core/error.h"

namespace dstrain::zero {
namespace {

class PostAccumulateHook : public torch::autograd::FunctionPostHook {
 public:
  explicit PostAccumulateHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

}  // namespace

AccumulatorHandle add_post_accumulate_hook(const torch::Tensor& param,
                                           std::function<void()> on_grad_ready) {
  if (!param.is_leaf() || !param.requires_grad()) {
    fail(ErrorKind::kInternal, "gradient hook: parameter is not a leaf that requires grad");
  }
  AccumulatorHandle accumulator = torch::autograd::impl::grad_accumulator(param);
  accumulator->add_post_hook(std::make_unique<PostAccumulateHook>(std::move(on_grad_ready)));
  return accumulator;
}

}  // namespace dstrain::zero
