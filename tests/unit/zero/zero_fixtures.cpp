#include "tests/unit/zero/zero_fixtures.h"

#include <cmath>
#include <mutex>

#include "model/weight_decay.h"
#include "zero/no_decay.h"

namespace dstrain::zero::testing {

TestAdamW::TestAdamW(int64_t numel, double weight_decay, const std::vector<optim::Range>& no_decay)
    : exp_avg_(torch::zeros({numel})),
      exp_avg_sq_(torch::zeros({numel})),
      decay_(torch::ones({numel})),
      weight_decay_(weight_decay) {
  for (const optim::Range& r : no_decay) decay_.narrow(0, r.begin, r.end - r.begin).zero_();
}

void TestAdamW::begin_step(double lr) {
  ++steps_;
  lr_ = lr;
}

void TestAdamW::update(torch::Tensor& params, const torch::Tensor& grad_in, int64_t offset,
                       const torch::Tensor& compute_copy) {
  const torch::Tensor grads = grad_in.to(torch::kFloat);
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, lr = lr_;
  const int64_t n = params.numel();
  torch::Tensor m = exp_avg_.narrow(0, offset, n), v = exp_avg_sq_.narrow(0, offset, n);
  params.mul_(1 - lr * weight_decay_ * decay_.narrow(0, offset, n));
  m.mul_(b1).add_(grads, 1 - b1);
  v.mul_(b2).addcmul_(grads, grads, 1 - b2);
  const double bc1 = 1 - std::pow(b1, steps_);
  const double bc2 = 1 - std::pow(b2, steps_);
  params.addcdiv_(m, v.sqrt() / std::sqrt(bc2) + eps, -lr / bc1);
  if (compute_copy.defined()) compute_copy.copy_(params);
}

std::map<std::string, torch::Tensor> TestAdamW::state() const {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

void TestAdamW::load_state(const std::map<std::string, torch::Tensor>& state, int64_t step_count) {
  exp_avg_.copy_(state.at("exp_avg"));
  exp_avg_sq_.copy_(state.at("exp_avg_sq"));
  steps_ = step_count;
}

OptimizerFactory adamw_factory(double weight_decay) {
  return [weight_decay](int64_t numel, std::vector<optim::Range> no_decay) {
    return std::make_unique<TestAdamW>(numel, weight_decay, no_decay);
  };
}

OptimizerFactory real_adamw_factory(double weight_decay) {
  return [weight_decay](int64_t numel, std::vector<optim::Range> no_decay) {
    optim::AdamWOptions options;
    options.weight_decay = weight_decay;
    options.no_decay = std::move(no_decay);
    return optim::make_adamw(numel, options);
  };
}

TinyMlpImpl::TinyMlpImpl(int64_t in, int64_t hidden, int64_t out) {
  fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
  norm_weight = register_parameter("norm_weight", torch::ones({hidden}));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
}

torch::Tensor TinyMlpImpl::forward(const torch::Tensor& x) {
  return fc2(torch::tanh(fc1(x)) * norm_weight);
}

torch::Tensor TinyMlpImpl::forward_fp32(const torch::Tensor& x) {
  auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat32); };
  torch::Tensor h = torch::tanh(torch::linear(f(x), f(fc1->weight), f(fc1->bias))) * f(norm_weight);
  return torch::linear(h, f(fc2->weight), f(fc2->bias));
}

Problem make_problem(int steps, int64_t hidden, uint64_t seed) {
  Problem p;
  p.steps = steps;
  p.hidden = hidden;
  torch::manual_seed(seed);
  TinyMlp model(p.in, p.hidden, p.out);
  for (const auto& item : model->named_parameters()) {
    p.init.push_back(item.value().detach().clone() + 0.05 * torch::randn_like(item.value()));
  }
  p.x = torch::randn({steps, p.batch, p.in});
  p.y = torch::randn({steps, p.batch, p.out});
  return p;
}

TinyMlp make_model(const Problem& problem, torch::ScalarType dtype) {
  TinyMlp model(problem.in, problem.hidden, problem.out);
  torch::NoGradGuard no_grad;
  auto params = model->parameters();
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(problem.init[i]);
  model->to(dtype);
  return model;
}

std::vector<NamedParameter> named_parameters(TinyMlp& model) {
  std::vector<NamedParameter> out;
  for (const auto& item : model->named_parameters()) out.push_back({item.key(), item.value()});
  return out;
}

torch::Tensor micro_batch(const torch::Tensor& batch, int world, int rank, int accum, int micro) {
  const int64_t rows = batch.size(0) / (world * accum);
  return batch.narrow(0, (rank * accum + micro) * rows, rows);
}

void drive_ranks(const RunConfig& config, EngineRecord& record,
                 const std::function<RankSide(ThreadCommunicator&)>& make_side) {
  const int accum = config.accum;
  std::vector<std::vector<double>> losses(config.world, std::vector<double>(config.steps, 0.0));
  record.memory.resize(config.world);
  record.comm.resize(config.world);
  std::mutex mutex;
  run_ranks(config.world, [&](ThreadCommunicator& comm) {
    const int rank = comm.rank();
    RankSide side = make_side(comm);
    for (int s = 0; s < config.steps; ++s) {
      comm.reset_stats();
      if (config.set_step_lr) side.engine->set_step_lr(config.lr);
      for (int m = 0; m < accum; ++m) {
        torch::Tensor loss = side.loss(s, m);
        losses[rank][s] += loss.item<double>() / accum;
        side.engine->backward(loss, {m, accum});
      }
      StepResult step = side.engine->step(config.lr);
      if (rank == 0) record.steps.push_back(step);
    }
    std::lock_guard<std::mutex> lock(mutex);
    record.memory[rank] = side.engine->bytes();
    record.comm[rank] = comm.stats();
    if (side.record) side.record(rank, *side.engine);
  });
  for (int s = 0; s < config.steps; ++s) {
    double sum = 0;
    for (int r = 0; r < config.world; ++r) sum += losses[r][s];
    record.losses.push_back(sum / config.world);
  }
}

RunResult run_engine(const Problem& problem, const RunConfig& config) {
  RunResult result;
  drive_ranks(config, result, [&](ThreadCommunicator& comm) {
    const int rank = comm.rank();
    TinyMlp model = make_model(problem);
    RankSide side;
    side.engine = make_engine(named_parameters(model), comm, config.optimizer, config.options);
    side.loss = [&problem, &config, model, rank](int s, int m) mutable {
      const torch::Tensor x = micro_batch(problem.x[s], config.world, rank, config.accum, m);
      const torch::Tensor y = micro_batch(problem.y[s], config.world, rank, config.accum, m);
      const torch::Tensor out = model->forward(x.to(config.options.compute_dtype));
      return torch::mse_loss(out.to(torch::kFloat32), y);
    };
    side.record = [&result, model](int rank, Engine&) mutable {
      if (rank != 0) return;
      for (const auto& p : model->parameters())
        result.params.push_back(p.detach().to(torch::kFloat32).clone());
    };
    return side;
  });
  return result;
}

RunResult run_reference(const Problem& problem, int steps, double clip, double lr) {
  RunResult result;
  TinyMlp model = make_model(problem);
  std::vector<torch::Tensor> params;
  std::vector<optim::Range> no_decay;
  int64_t numel = 0;
  for (const auto& item : model->named_parameters()) {
    params.push_back(item.value());
    const int64_t n = item.value().numel();
    if (dstrain::model::takes_no_decay(item.key(), item.value().dim())) {
      no_decay.push_back({numel, numel + n});
    }
    numel += n;
  }
  TestAdamW adam(numel, 0.1, no_decay);
  for (int s = 0; s < steps; ++s) {
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    torch::Tensor loss = torch::mse_loss(model->forward(problem.x[s]), problem.y[s]);
    loss.backward();
    result.losses.push_back(loss.item<double>());
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> flat_p, flat_g;
    for (auto& p : params) {
      flat_p.push_back(p.detach().reshape({-1}));
      flat_g.push_back(p.grad().reshape({-1}));
    }
    torch::Tensor fp = torch::cat(flat_p), fg = torch::cat(flat_g);
    StepResult step;
    const double norm = fg.norm().item<double>();
    step.grad_norm_tensor = torch::tensor({norm}, torch::kFloat64);
    if (clip > 0 && norm > clip) fg.mul_(clip / (norm + 1e-6));
    adam.step(fp, fg, lr);
    int64_t offset = 0;
    for (auto& p : params) {
      p.detach().copy_(fp.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
    result.steps.push_back(step);
  }
  for (auto& p : params) result.params.push_back(p.detach().clone());
  return result;
}

}  // namespace dstrain::zero::testing
