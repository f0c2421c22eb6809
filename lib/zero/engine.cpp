// Engine: the micro-step order every implementation relies on, and make_engine().
#include "zero/engine.h"

#include <algorithm>
#include <map>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "zero/grouped_engine.h"
#include "zero/sharded_engine.h"
#include "zero/stage3_engine.h"

namespace dstrain::zero {
namespace {

// What no implementation can honour, checked before any memory is allocated.
void validate(const EngineOptions& options, const std::vector<NamedParameter>& params) {
  if (options.stage < 0 || options.stage > 3) {
    fail(ErrorKind::kConfig, "zero_optimization.stage is {}; expected 0, 1, 2 or 3", options.stage);
  }
  if (options.gradient_clipping < 0) {
    fail(ErrorKind::kConfig, "gradient_clipping is {}; expected >= 0 (0 disables)",
         options.gradient_clipping);
  }
  const torch::ScalarType dtype = options.compute_dtype;
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kHalf) {
    fail(ErrorKind::kConfig, "compute dtype {} is not supported; expected fp32, bf16 or fp16",
         c10::toString(dtype));
  }
  LossScaler(dtype == torch::kHalf, options.loss_scaling);  // throws for bad fp16 scaling options
  int64_t numel = 0;
  for (const NamedParameter& p : params) {
    if (!p.frozen) numel += p.tensor.defined() ? p.tensor.numel() : 0;
  }
  // One part of a model (a pipeline stage with LoRA adapters on other stages' layers only) may
  // have nothing to train: it still computes its input's gradients and joins the norm; a whole
  // model may not.
  if (numel == 0 && options.model_parallel.world == nullptr) {
    fail(ErrorKind::kConfig, "the model has no trainable parameters");
  }
  if (params.empty()) fail(ErrorKind::kInternal, "zero engine: no parameters at all");
}

}  // namespace

torch::Tensor initial_elements(const NamedParameter& p, const InitialValues& source, Range r) {
  if (source) {
    torch::Tensor v = source(p.name, r.begin, r.end);
    if (v.numel() != r.end - r.begin) {
      fail(ErrorKind::kInternal, "zero engine: initial values of '{}' [{}, {}) have {} elements",
           p.name, r.begin, r.end, v.numel());
    }
    return v.reshape({-1});
  }
  return p.tensor.detach().reshape({-1}).narrow(0, r.begin, r.end - r.begin);
}

void Engine::check_in_order(MicroStep micro) const {
  const bool in_order = micro.index == done_.index + 1 && micro.index < micro.count &&
                        (micro.first() || micro.count == done_.count);
  if (!in_order) {
    fail(ErrorKind::kInternal,
         "zero engine: backward() of micro-step {} of {} out of order ({} of {} since step())",
         micro.index, micro.count, done_.index + 1, done_.count);
  }
}

void Engine::run_backward_of(const torch::Tensor& root, const torch::Tensor& root_grad,
                             MicroStep micro) {
  before_autograd(micro);
  if (!root_grad.defined()) {
    (root * (backward_scale() / static_cast<double>(micro.count))).backward();
  } else {
    run_backward(root, root_grad);
  }
  after_autograd();
}

void Engine::backward(const torch::Tensor& loss, MicroStep micro) {
  check_in_order(micro);
  run_backward_of(loss, torch::Tensor(), micro);
  done_ = micro;
}

void Engine::backward_from(const torch::Tensor& output, const torch::Tensor& output_grad,
                           MicroStep micro) {
  if (!output_grad.defined()) {
    fail(ErrorKind::kInternal, "zero engine: backward_from() without the output's gradient");
  }
  check_in_order(micro);
  run_backward_of(output, output_grad, micro);
  done_ = micro;
}

void run_backward(const torch::Tensor& root, const torch::Tensor& grad) {
  if (!root.requires_grad()) return;
  torch::autograd::Engine::get_default_engine().execute(
      {torch::autograd::impl::gradient_edge(root)}, {grad}, /*keep_graph=*/false,
      /*create_graph=*/false, /*accumulate_grad=*/true);
}

StepResult Engine::step(double lr) {
  if (done_.index < 0 || !done_.last()) {
    fail(ErrorKind::kInternal, "zero engine: step() after {} of {} micro-steps", done_.index + 1,
         done_.count);
  }
  done_ = MicroStep{-1, 0};
  if (step_lr_ && *step_lr_ != lr) {
    fail(ErrorKind::kInternal, "zero engine: step({}) after set_step_lr({})", lr, *step_lr_);
  }
  const StepResult result = reduce_norm(prepare_step());
  finish_step(result, lr);
  step_lr_.reset();
  return result;
}

void Engine::load_state(const StateSource& source, int64_t step_count,
                        const LossScalerState& scaler) {
  done_ = MicroStep{-1, 0};
  step_lr_.reset();
  do_load_state(source, step_count, scaler);
}

void Engine::discard_micro_steps() {
  done_ = MicroStep{-1, 0};
  step_lr_.reset();
  do_discard();
}

ckpt::State Engine::snapshot_state(ckpt::Snapshot how) const {
  ckpt::State s;
  for (const StatePiece& sp : owned_state()) {
    for (const auto& [kind, t] : sp.tensors) {
      s.pieces.push_back({kind, sp.param, sp.shape, sp.elements.begin, sp.elements.end,
                          ckpt::snapshot_tensor(t, how)});
    }
  }
  s.json = {{"optimizer_steps", step_count()}};
  return s;
}

void Engine::restore_state(const ckpt::StateIn& in) {
  std::map<std::string, std::vector<int64_t>> saved;
  for (auto& [name, shape] : in.params("master")) saved[name] = shape;
  for (const StatePiece& sp : owned_state()) {
    const auto it = saved.find(sp.param);
    if (it == saved.end() || it->second != sp.shape) {
      fail(ErrorKind::kInput, "{}: does not match the model: parameter {} is {} there", in.origin(),
           sp.param, it == saved.end() ? "missing" : "of another shape");
    }
  }
  int64_t steps = 0;
  try {
    steps = in.json().at("optimizer_steps").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInput, "{}: {}", in.origin(), e.what());
  }
  load_state([&in](const std::string& kind, const std::string& param,
                   Range r) { return in.read(kind, param, r.begin, r.end); },
             steps, loss_scaler().state());
}

std::unique_ptr<Engine> make_engine(std::vector<NamedParameter> params, comm::Communicator& comm,
                                    const OptimizerFactory& make_optimizer, EngineOptions options) {
  validate(options, params);
  if (options.shard_group) {
    // The parameters by the group they shard over, in the order of their first parameters.
    std::vector<std::pair<EngineOptions::ShardGroup, std::vector<NamedParameter>>> groups;
    for (NamedParameter& p : params) {
      EngineOptions::ShardGroup g = options.shard_group(p.placement);
      if (g.comm == nullptr) g = {&comm, 1.0};
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&g](const auto& e) { return e.first.comm == g.comm; });
      if (it == groups.end()) it = groups.insert(groups.end(), {g, {}});
      it->second.push_back(std::move(p));
    }
    options.shard_group = nullptr;
    if (groups.size() > 1 && options.compute_dtype == torch::kHalf) {
      fail(ErrorKind::kConfig,
           "fp16 with parameters sharded over different ranks (expert parallelism) is not "
           "supported: its loss scale would be kept apart for each group; use bf16");
    }
    if (groups.size() > 1 || groups.front().first.comm != &comm ||
        groups.front().first.gradient_scale != 1.0) {
      std::vector<std::unique_ptr<Engine>> parts;
      for (auto& [group, members] : groups) {
        EngineOptions part = options;
        part.gradient_scale = group.gradient_scale;
        parts.push_back(make_engine(std::move(members), *group.comm, make_optimizer, part));
      }
      return std::make_unique<GroupedEngine>(std::move(parts));
    }
    params = std::move(groups.front().second);
  }
  if (options.stage == 3) {
    return std::make_unique<Stage3Engine>(std::move(params), comm, make_optimizer,
                                          std::move(options));
  }
  return std::make_unique<ShardedEngine>(std::move(params), comm, make_optimizer,
                                         std::move(options));
}

}  // namespace dstrain::zero
