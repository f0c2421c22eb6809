#include "tests/unit/zero/stage3_fixtures.h"

#include "core/error.h"

namespace dstrain::zero::testing {

TinyStackImpl::TinyStackImpl(const StackShape& s) : shape(s) {
  embed = register_parameter("embed", torch::zeros({s.vocab, s.dim}));
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = "layer" + std::to_string(i) + "_";
    w.push_back(register_parameter(p + "w", torch::zeros({s.dim, s.dim})));
    b.push_back(register_parameter(p + "bias", torch::zeros({s.dim})));
    g.push_back(register_parameter(p + "gate", torch::zeros({s.dim})));
  }
  norm = register_parameter("norm", torch::zeros({s.dim}));
  if (!s.tied) head = register_parameter("head", torch::zeros({s.vocab, s.dim}));
}

torch::Tensor TinyStackImpl::forward(const torch::Tensor& ids, Engine* engine) {
  auto pre = [&](size_t k) {
    if (engine) engine->pre_forward(k);
  };
  auto post = [&](size_t k, const torch::Tensor& out) {
    if (engine) engine->post_forward(k, out);
  };
  pre(0);
  torch::Tensor h = torch::embedding(embed, ids);
  post(0, h);
  for (int64_t i = 0; i < shape.layers; ++i) {
    const auto k = static_cast<size_t>(1 + i);
    pre(k);
    h = h + torch::tanh(torch::linear(h, w[i], b[i])) * g[i];
    post(k, h);
  }
  const auto last = static_cast<size_t>(shape.layers + 1);
  pre(last);
  torch::Tensor logits = torch::linear(h * norm, shape.tied ? embed : head);
  post(last, logits);
  return logits;
}

std::vector<NamedParameter> TinyStackImpl::units() {
  std::vector<NamedParameter> out;
  for (const auto& item : named_parameters()) {
    const std::string& name = item.key();
    int unit = static_cast<int>(shape.layers) + 1;
    if (name == "embed") unit = 0;
    if (name.rfind("layer", 0) == 0) unit = 1 + std::stoi(name.substr(5));
    out.push_back({name, item.value(), unit});
  }
  return out;
}

std::vector<std::vector<int>> TinyStackImpl::segments() const {
  std::vector<std::vector<int>> out{{0}};
  for (int64_t i = 0; i < shape.layers; ++i) out.push_back({static_cast<int>(1 + i)});
  const int head = static_cast<int>(shape.layers) + 1;
  out.push_back(shape.tied ? std::vector<int>{head, 0} : std::vector<int>{head});
  return out;
}

StackProblem make_stack_problem(StackShape shape, int steps, uint64_t seed) {
  StackProblem p;
  p.shape = shape;
  p.steps = steps;
  torch::manual_seed(seed);
  TinyStack model(shape);
  for (const auto& item : model->named_parameters()) {
    const bool is_norm = item.key().find("norm") != std::string::npos ||
                         item.key().find("gate") != std::string::npos;
    torch::Tensor v = 0.4 * torch::randn(item.value().sizes());
    p.init[item.key()] = is_norm ? v + 1.0 : v;
  }
  p.ids = torch::randint(shape.vocab, {steps, p.batch, shape.seq}, torch::kInt64);
  p.labels = torch::randint(shape.vocab, {steps, p.batch, shape.seq}, torch::kInt64);
  return p;
}

TinyStack make_stack(const StackProblem& problem) {
  TinyStack model(problem.shape);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) item.value().copy_(problem.init.at(item.key()));
  return model;
}

namespace {

void assemble(StackResult& out, const std::vector<StatePiece>& pieces) {
  for (const StatePiece& piece : pieces) {
    int64_t numel = 1;
    for (int64_t d : piece.shape) numel *= d;
    for (const auto& [kind, values] : piece.tensors) {
      auto key = std::make_pair(kind, piece.param);
      if (!out.state.count(key)) out.state[key] = torch::zeros({numel});
      const int64_t n = piece.elements.end - piece.elements.begin;
      out.state[key].narrow(0, piece.elements.begin, n).copy_(values.to(torch::kFloat32));
      out.covered[key] += n;
    }
  }
}

StateSource source_of(const std::map<std::pair<std::string, std::string>, torch::Tensor>& saved) {
  return [&saved](const std::string& kind, const std::string& param, Range r) {
    auto it = saved.find({kind, param});
    if (it == saved.end()) fail(ErrorKind::kInput, "no {} for {}", kind, param);
    return it->second.narrow(0, r.begin, r.end - r.begin);
  };
}

}  // namespace

StackResult run_stack(const StackProblem& problem, const StackRun& run) {
  StackResult result;
  drive_ranks(run, result, [&](ThreadCommunicator& comm) {
    const int rank = comm.rank();
    TinyStack model = make_stack(problem);
    EngineOptions options = run.options;
    options.segments = model->segments();
    RankSide side;
    std::vector<NamedParameter> units = model->units();
    for (NamedParameter& p : units) {
      const std::string& suffix = run.frozen_suffix;
      if (suffix.empty() || p.name.size() < suffix.size() ||
          p.name.compare(p.name.size() - suffix.size(), suffix.size(), suffix) != 0) {
        continue;
      }
      p.frozen = true;
      p.tensor.requires_grad_(false);
    }
    side.engine = make_engine(std::move(units), comm, run.optimizer, options);
    if (run.resume) side.engine->load_state(source_of(*run.resume), run.resume_steps, {});
    Engine* engine = side.engine.get();
    side.loss = [&problem, &run, model, rank, engine](int s, int m) mutable {
      const int64_t data_step = run.resume_steps + s;  // a resumed run reads on from there
      const torch::Tensor ids = micro_batch(problem.ids[data_step], run.world, rank, run.accum, m);
      const torch::Tensor labels =
          micro_batch(problem.labels[data_step], run.world, rank, run.accum, m);
      const torch::Tensor logits = model->forward(ids, engine).to(torch::kFloat32);
      return torch::cross_entropy_loss(logits.reshape({-1, problem.shape.vocab}),
                                       labels.reshape({-1}));
    };
    side.record = [&result](int, Engine& e) { assemble(result, e.owned_state()); };
    return side;
  });
  return result;
}

}  // namespace dstrain::zero::testing
