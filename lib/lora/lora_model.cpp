#include "lora/lora_model.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "model/storage.h"

namespace dstrain::lora {

// The adapter installed in a projection: B·A·dropout(x)·scale. Holds the same tensor objects as
// LoraModel::named_parameters(), so storage moved by the engine is seen here.
class LoraAdapter : public model::LinearAdapter {
 public:
  // `weight`: the placement of the projection's weight over `tp` (tensor parallelism; null: none).
  LoraAdapter(torch::Tensor a, torch::Tensor b, double scale, double dropout,
              model::TensorParallel* tp, const model::Placement& weight)
      : A(std::move(a)),
        B(std::move(b)),
        scale_(scale),
        dropout_(dropout),
        tp_(tp),
        row_parallel_(tp != nullptr && weight.kind == model::PlacementKind::kRow),
        column_parallel_(tp != nullptr && weight.kind == model::PlacementKind::kColumn) {}

  // A [r, in] by columns under a row-parallel weight, else whole with a partial gradient under a
  // column-parallel one; B [out, r] by rows under a column-parallel weight, else whole with a
  // partial gradient under a row-parallel one.
  model::Placement a_placement() const {
    return row_parallel_ ? model::Placement::split(model::PlacementKind::kRow)
                         : model::Placement::replicated_with(column_parallel_);
  }
  model::Placement b_placement() const {
    return column_parallel_ ? model::Placement::split(model::PlacementKind::kColumn)
                            : model::Placement::replicated_with(row_parallel_);
  }

  // x [..., in] → [..., out]
  torch::Tensor delta(const torch::Tensor& x, bool training) override {
    const torch::Tensor h = training && dropout_ > 0 ? dropout(x) : x;
    namespace F = torch::nn::functional;
    // The whole one of A and B takes this rank's part of its gradient (its placement).
    return F::linear(F::linear(h, A), B) * scale_;
  }
  std::vector<torch::Tensor> parameters() const override { return {A, B}; }

  torch::Tensor A;  // [r, in]
  torch::Tensor B;  // [out, r]

 private:
  // A row-parallel projection's input is this rank's columns of the whole input: the whole
  // input's mask is drawn (as torch::dropout draws it on the CPU) and this rank's columns taken.
  torch::Tensor dropout(const torch::Tensor& x) const {
    if (!row_parallel_) return torch::dropout(x, dropout_, true);
    std::vector<int64_t> whole = x.sizes().vec();
    const int64_t k = whole.back();
    whole.back() = k * tp_->size();
    const torch::Tensor mask = torch::empty(whole, x.options())
                                   .bernoulli_(1 - dropout_)
                                   .div_(1 - dropout_)
                                   .narrow(-1, tp_->rank() * k, k);
    return x * mask;
  }

  double scale_;
  double dropout_;
  model::TensorParallel* tp_;
  bool row_parallel_;
  bool column_parallel_;
};

// The adapter installed on an expert stack [E, out, in], as PEFT's ParamWrapper lays it out:
// A [r·E, in] holds expert e's A_e [r, in] at rows e·r.., B [out, r·E] its B_e [out, r] at columns
// e, E + e, 2E + e, ...; expert e's ΔW_e = B_e·A_e·scale, computed per row as two grouped products
// of rank r (no [E, out, in] delta is formed). No dropout (PEFT refuses it on stacks).
class ExpertsLoraAdapter : public model::ExpertsAdapter {
 public:
  ExpertsLoraAdapter(torch::Tensor a, torch::Tensor b, int64_t experts, double scale)
      : A(std::move(a)), B(std::move(b)), experts_(experts), scale_(scale) {}

  torch::Tensor delta(const torch::Tensor& rows, const torch::Tensor& ends, bool grouped) override {
    const int64_t r = A.size(0) / experts_;
    const torch::Tensor a = A.reshape({experts_, r, A.size(1)});
    const torch::Tensor b = B.reshape({B.size(0), r, experts_}).permute({2, 0, 1}).contiguous();
    return model::expert_linear(model::expert_linear(rows, a, ends, grouped), b, ends, grouped) *
           scale_;
  }

  torch::Tensor A;  // [r·E, in]
  torch::Tensor B;  // [out, r·E]

 private:
  int64_t experts_;
  double scale_;
};

namespace {

std::string shape_str(torch::IntArrayRef sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

// A [rows, in] float32 from `gen`, as PEFT initialises it (rows: r, or r·E for an expert stack).
torch::Tensor initial_a(int64_t rows, int64_t in, int64_t r, const std::string& init,
                        at::Generator& gen) {
  torch::Tensor a = torch::empty({rows, in}, torch::kFloat);
  if (init == "gaussian") {
    a.normal_(0.0, 1.0 / static_cast<double>(r), gen);
  } else {
    // kaiming_uniform_(a=√5): gain √(2/(1+5)), bound = gain·√(3/fan_in) = 1/√fan_in.
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    a.uniform_(-bound, bound, gen);
  }
  return a;
}

}  // namespace

std::string lora_a_name(const std::string& module) {
  return module + ".lora_A.weight";
}
std::string lora_b_name(const std::string& module) {
  return module + ".lora_B.weight";
}
std::string whole_name(const std::string& module) {
  return module + ".modules_to_save.weight";
}

LoraModel::LoraModel(model::DecoderModel model, LoraOptions options, const std::string& key)
    : model_(std::move(model)), options_(std::move(options)) {
  if (options_.init != "default" && options_.init != "gaussian") {
    fail(ErrorKind::kConfig, "{}: lora.init '{}' is not supported; expected default or gaussian",
         key, options_.init);
  }
  if (model_->config().moe.experts > 0 && !options_.target_regex &&
      is_all_linear(options_.target_modules)) {
    // PEFT's all-linear takes every nn.Linear but the head: the routers too.
    fail(ErrorKind::kConfig,
         "{}: lora.target_modules: all-linear on a Mixture-of-Experts model ({}) would adapt the "
         "routers (mlp.gate) as PEFT does, which dstrain does not; name the projections, e.g. "
         "[q_proj, k_proj, v_proj, o_proj], and the experts with lora.target_parameters: "
         "[mlp.experts.gate_up_proj, mlp.experts.down_proj]",
         key, model_->config().model_type);
  }
  const bool stacks = !options_.target_parameters.empty();
  if (stacks && options_.dropout > 0) {
    fail(ErrorKind::kConfig,
         "{}: lora.dropout is {} with lora.target_parameters; an adapter on an expert stack takes "
         "no dropout (PEFT refuses it too); set lora.dropout: 0",
         key, options_.dropout);
  }
  // target_modules may be empty where target_parameters chooses the adapters (as in PEFT).
  if (!stacks || !options_.target_modules.empty()) {
    targets_ = resolve_targets(*model_, options_.target_modules, options_.target_regex,
                               key + ": lora.target_modules");
  }
  if (!options_.target_regex) {
    options_.target_modules = expand_all_linear(*model_, options_.target_modules);
  }
  for (TargetModule& t :
       resolve_parameters(*model_, options_.target_parameters, key + ": lora.target_parameters")) {
    targets_.push_back(std::move(t));
  }
  for (TargetModule& t :
       resolve_whole(*model_, options_.modules_to_save, key + ": lora.modules_to_save")) {
    targets_.push_back(std::move(t));
  }
  // Block by block: the projections, then the expert stacks and the modules trained whole.
  std::stable_sort(targets_.begin(), targets_.end(),
                   [](const TargetModule& a, const TargetModule& b) { return a.block < b.block; });
  // A generator of its own: the adapters' values depend on the seed alone, not on what else
  // drew from the global generator.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(options_.seed);
  model::TensorParallel* tp = model_->tensor_parallel();
  torch::NoGradGuard no_grad;
  const int64_t r = options_.r;
  for (auto& t : targets_) {
    if (t.whole) {  // the base weight's values where it has them (else the engine's: starts_from)
      torch::Tensor w = torch::zeros({t.out_features, t.in_features}, torch::kFloat);
      if (model::storage_bytes(t.weight) > 0) w.copy_(t.weight);
      w.set_requires_grad(true);
      t.linear->trained = w;
      installed_.push_back({{}, {}, {}, {}, w});
      continue;
    }
    if (t.is_stack()) {  // replicated: a MoE model runs without tensor parallelism
      torch::Tensor a = initial_a(r * t.num_experts, t.in_features, r, options_.init, gen);
      torch::Tensor b = torch::zeros({t.out_features, r * t.num_experts}, torch::kFloat);
      a.set_requires_grad(true);
      b.set_requires_grad(true);
      t.experts->adapter(t.parameter) =
          std::make_shared<ExpertsLoraAdapter>(a, b, t.num_experts, options_.scale());
      installed_.push_back({a, b, model::Placement{}, model::Placement{}, {}});
      continue;
    }
    const model::Placement& placement = t.linear->weight_placement;
    // A drawn whole (a row-parallel projection's input is this rank's columns of it), then sliced.
    const int64_t columns =
        tp != nullptr && placement.kind == model::PlacementKind::kRow ? tp->size() : 1;
    torch::Tensor a = initial_a(r, t.in_features * columns, r, options_.init, gen);
    if (columns > 1) a = a.narrow(1, tp->rank() * t.in_features, t.in_features).contiguous();
    torch::Tensor b = torch::zeros({t.out_features, r}, torch::kFloat);
    a.set_requires_grad(true);
    b.set_requires_grad(true);
    auto adapter =
        std::make_shared<LoraAdapter>(a, b, options_.scale(), options_.dropout, tp, placement);
    installed_.push_back({a, b, adapter->a_placement(), adapter->b_placement(), {}});
    t.linear->adapter = std::move(adapter);
  }
}

LoraModel::~LoraModel() {
  for (auto& t : targets_) {
    if (t.whole) {
      t.linear->trained = torch::Tensor();
    } else if (t.is_stack()) {
      t.experts->adapter(t.parameter) = nullptr;
    } else {
      t.linear->adapter = nullptr;
    }
  }
}

std::vector<std::string> LoraModel::modules() const {
  std::vector<std::string> out;
  for (const auto& t : targets_) {
    if (!t.whole) out.push_back(t.path);
  }
  return out;
}

std::vector<std::string> LoraModel::whole_modules() const {
  std::vector<std::string> out;
  for (const auto& t : targets_) {
    if (t.whole) out.push_back(t.path);
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> LoraModel::named_parameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (BlockParameter& p : block_parameters()) out.emplace_back(std::move(p.name), p.tensor);
  return out;
}

std::vector<LoraModel::BlockParameter> LoraModel::block_parameters() const {
  std::vector<BlockParameter> out;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const Installed& a = installed_[i];
    if (targets_[i].whole) {
      out.push_back({whole_name(targets_[i].path), a.whole, targets_[i].block, model::Placement{},
                     a.loaded ? std::string() : targets_[i].path + ".weight"});
      continue;
    }
    out.push_back({lora_a_name(targets_[i].path), a.A, targets_[i].block, a.a_placement, {}});
    out.push_back({lora_b_name(targets_[i].path), a.B, targets_[i].block, a.b_placement, {}});
  }
  return out;
}

std::vector<LoraWeights> LoraModel::weights() const {
  std::vector<LoraWeights> out;
  for (size_t i = 0; i < targets_.size(); ++i) {
    out.push_back({targets_[i].path, installed_[i].A, installed_[i].B, installed_[i].whole});
  }
  return out;
}

int64_t LoraModel::num_parameters() const {
  int64_t n = 0;
  for (const Installed& a : installed_) {
    for (const torch::Tensor* t : {&a.A, &a.B, &a.whole}) n += t->defined() ? t->numel() : 0;
  }
  return n;
}

void LoraModel::load(const std::vector<LoraWeights>& from, const std::string& source) {
  std::map<std::string, const LoraWeights*> by_module;
  for (const auto& w : from) by_module[w.module] = &w;
  torch::NoGradGuard no_grad;
  model::TensorParallel* tp = model_->tensor_parallel();
  // The whole tensor of this rank's `local` slice of it, placed as `placement`.
  const auto whole_sizes = [tp](const torch::Tensor& local, const model::Placement& placement) {
    std::vector<int64_t> sizes = local.sizes().vec();
    if (tp && !placement.replicated()) sizes.at(static_cast<size_t>(placement.dim())) *= tp->size();
    return sizes;
  };
  const auto slice = [tp](const torch::Tensor& whole, const torch::Tensor& local,
                          const model::Placement& placement) {
    if (!tp || placement.replicated()) return whole;
    const int64_t n = local.size(placement.dim());
    return whole.narrow(placement.dim(), tp->rank() * n, n);
  };
  for (size_t i = 0; i < targets_.size(); ++i) {
    const std::string& module = targets_[i].path;
    const auto it = by_module.find(module);
    if (it == by_module.end()) {
      fail(ErrorKind::kInput, "{}: the adapter has no weights for module {}", source, module);
    }
    Installed& a = installed_[i];
    if (targets_[i].whole) {
      const torch::Tensor& w = it->second->whole;
      if (!w.defined() || w.sizes() != a.whole.sizes()) {
        fail(ErrorKind::kInput,
             "{}: module {} (modules_to_save) needs a weight {}, the adapter has {}", source,
             module, shape_str(a.whole.sizes()),
             w.defined() ? shape_str(w.sizes()) : std::string("lora_A/lora_B"));
      }
      a.whole.copy_(w);
      a.loaded = true;
      by_module.erase(it);
      continue;
    }
    if (it->second->is_whole()) {
      fail(ErrorKind::kInput,
           "{}: module {} has a whole weight (modules_to_save) but this run adapts it with LoRA",
           source, module);
    }
    const model::Placement split_a = a.a_placement, split_b = a.b_placement;
    const std::vector<int64_t> want_a = whole_sizes(a.A, split_a),
                               want_b = whole_sizes(a.B, split_b);
    if (it->second->A.sizes() != c10::IntArrayRef(want_a) ||
        it->second->B.sizes() != c10::IntArrayRef(want_b)) {
      fail(ErrorKind::kInput,
           "{}: module {}: lora_A {} / lora_B {} do not fit this model, which needs {} / {}",
           source, module, shape_str(it->second->A.sizes()), shape_str(it->second->B.sizes()),
           shape_str(want_a), shape_str(want_b));
    }
    a.A.copy_(slice(it->second->A, a.A, split_a));
    a.B.copy_(slice(it->second->B, a.B, split_b));
    by_module.erase(it);
  }
  if (!by_module.empty()) {
    fail(ErrorKind::kInput,
         "{}: the adapter has weights for module {}, which this run does not adapt", source,
         by_module.begin()->first);
  }
}

void merge_lora(model::DecoderModelImpl& model, const std::vector<LoraWeights>& weights,
                const LoraOptions& options) {
  std::map<std::string, TargetModule> by_path;
  for (auto& t : targetable_modules(model)) by_path[t.path] = t;
  for (auto& t :
       resolve_parameters(model, options.target_parameters, "the adapter's target_parameters")) {
    by_path[t.path] = t;
  }
  for (auto& t : resolve_whole(model, options.modules_to_save, "the adapter's modules_to_save")) {
    by_path[t.path] = t;
  }
  torch::NoGradGuard no_grad;
  for (const auto& w : weights) {
    const auto it = by_path.find(w.module);
    if (it == by_path.end()) {
      fail(ErrorKind::kInput, "LoRA module {} is not a projection or expert stack of this model",
           w.module);
    }
    torch::Tensor& W = it->second.weight;
    if (w.is_whole() != it->second.whole) {
      fail(ErrorKind::kInput, "LoRA module {}: {}", w.module,
           w.is_whole() ? "a whole weight for a module the adapter adapts"
                        : "lora_A/lora_B for a module of modules_to_save");
    }
    if (w.is_whole()) {
      if (w.whole.sizes() != W.sizes()) {
        fail(ErrorKind::kInput, "LoRA module {}: the weight is {} but the model's is {}", w.module,
             shape_str(w.whole.sizes()), shape_str(W.sizes()));
      }
      W.copy_(w.whole);
      continue;
    }
    const torch::Tensor A = w.A.to(torch::kFloat), B = w.B.to(torch::kFloat);
    torch::Tensor delta;  // [out, in], or [E, out, in]: expert e's B_e·A_e (ExpertsLoraAdapter)
    if (it->second.is_stack()) {
      const int64_t E = it->second.num_experts, r = A.size(0) / E;
      delta = torch::bmm(B.reshape({B.size(0), r, E}).permute({2, 0, 1}),
                         A.reshape({E, r, A.size(1)})) *
              options.scale();
    } else {
      delta = torch::matmul(B, A) * options.scale();
    }
    if (delta.sizes() != W.sizes()) {
      fail(ErrorKind::kInput, "LoRA module {}: B·A is {} but the weight is {}", w.module,
           shape_str(delta.sizes()), shape_str(W.sizes()));
    }
    W.copy_(W.to(torch::kFloat) + delta);
  }
}

}  // namespace dstrain::lora
