#include "model/activation_checkpoint.h"

#include "model/activation_offload.h"
#include "model/rng_state.h"

#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/utils.h>

namespace dstrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward needs besides the saved inputs. Held by the autograd context as a capsule.
struct Closure : torch::CustomClassHolder {
  CheckpointedFn fn;
  size_t num_fn_inputs = 0;         // the leading inputs fn receives (an anchor may follow)
  std::vector<bool> requires_grad;  // per input, as seen in forward
  RngState rng;
  CheckpointOffload offload;
  // Per input: its store entry when offloaded (the graph then saves an undefined tensor).
  std::vector<std::shared_ptr<ActivationOffload::Entry>> offloaded;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // Runs with grad mode off (Function::apply guarantees it): nothing of fn's graph is recorded.
  static torch::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<Closure> closure,
                               at::TensorList inputs) {
    closure->rng = capture_rng(inputs);
    const variable_list fn_inputs(inputs.begin(),
                                  inputs.begin() + static_cast<int64_t>(closure->num_fn_inputs));
    torch::Tensor out = closure->fn(fn_inputs);
    variable_list kept = inputs.vec();
    closure->offloaded.resize(kept.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      const auto& marks = closure->offload.inputs;
      if (!closure->offload.store || i >= marks.size() || !marks[i] || !kept[i].defined()) continue;
      closure->offloaded[i] = closure->offload.store->store(kept[i]);
      kept[i] = torch::Tensor();
    }
    ctx->save_for_backward(kept);
    ctx->saved_data["closure"] = c10::IValue::make_capsule(std::move(closure));
    return out;
  }

  // grads: [d out]. Returns one entry per forward argument: none for the closure, then the
  // inputs' gradients (undefined for those that did not require grad).
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto closure =
        c10::static_intrusive_pointer_cast<Closure>(ctx->saved_data["closure"].toCapsule());
    variable_list saved = ctx->get_saved_variables();
    for (size_t i = 0; i < saved.size(); ++i) {
      if (!closure->offloaded[i]) continue;
      saved[i] = closure->offload.store->load(*closure->offloaded[i]);
      closure->offloaded[i].reset();
    }
    variable_list detached;
    for (size_t i = 0; i < closure->num_fn_inputs; ++i) {
      detached.push_back(saved[i].defined()
                             ? saved[i].detach().requires_grad_(closure->requires_grad[i])
                             : torch::Tensor());
    }
    const torch::Tensor out = recompute(*closure, detached);
    if (out.requires_grad()) torch::autograd::backward({out}, {grads[0]});
    variable_list result{torch::Tensor()};
    for (size_t i = 0; i < saved.size(); ++i) {
      result.push_back(i < detached.size() && closure->requires_grad[i] ? detached[i].grad()
                                                                        : torch::Tensor());
    }
    return result;
  }

 private:
  // fn again, with grad enabled and the forward's RNG state; the generators are put back after.
  static torch::Tensor recompute(const Closure& closure, const variable_list& inputs) {
    return replay_rng(closure.rng, inputs, [&] {
      torch::AutoGradMode grad(true);
      return closure.fn(inputs);
    });
  }
};

}  // namespace

torch::Tensor checkpoint(CheckpointedFn fn, const std::vector<torch::Tensor>& inputs) {
  return checkpoint(std::move(fn), inputs, CheckpointOffload{});
}

torch::Tensor checkpoint(CheckpointedFn fn, const std::vector<torch::Tensor>& inputs,
                         const CheckpointOffload& offload) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  auto closure = c10::make_intrusive<Closure>();
  closure->fn = std::move(fn);
  closure->offload = offload;
  closure->num_fn_inputs = inputs.size();
  variable_list all = inputs;
  bool any = false;
  for (const auto& t : inputs) {
    closure->requires_grad.push_back(t.defined() && t.requires_grad());
    any = any || closure->requires_grad.back();
  }
  if (!any) {
    // An empty leaf that requires grad makes the output require grad, so the block's backward
    // (and its parameters' gradients) still runs when none of its inputs needs a gradient.
    all.push_back(torch::empty({0}, torch::requires_grad()));
    closure->requires_grad.push_back(false);
  }
  // As a TensorList: Function::apply sees its tensors as the node's inputs (a std::vector would
  // count as one opaque argument).
  return CheckpointFunction::apply(std::move(closure), at::TensorList(all));
}

}  // namespace dstrain::model
