#include "model/moe.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "model/fused_layer_ops.h"
#include "model/storage.h"

namespace dstrain::model {
namespace {

// Whether at::_grouped_mm takes `t` as it is: its strides multiples of 16 bytes.
bool grouped_strides(const torch::Tensor& t) {
  const int64_t bytes = static_cast<int64_t>(t.element_size());
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1 && (t.stride(d) * bytes) % 16 != 0) return false;
  }
  return true;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

c10::intrusive_ptr<RouterRecord> held(RouterRecord* record) {
  return c10::intrusive_ptr<RouterRecord>::reclaim_copy(record);
}

RouterRecord* record_of(AutogradContext* ctx) {
  return static_cast<RouterRecord*>(ctx->saved_data["record"].toCapsule().get());
}

// A layer's output, unchanged; its backward gives the layer's router sums the gradient of the
// pooled sums (RouterRecord).
class RouterGradient : public torch::autograd::Function<RouterGradient> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& output,
                               const torch::Tensor& sums, c10::intrusive_ptr<RouterRecord> record) {
    ctx->saved_data["record"] = c10::IValue::make_capsule(std::move(record));
    return output;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0], record_of(ctx)->sums_grad(), torch::Tensor()};
  }
};

// The pooled sums, downstream of `last`: its backward, which runs before any layer's, keeps their
// gradient in the record and passes nothing on to `last`.
class RouterSink : public torch::autograd::Function<RouterSink> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& last,
                               const torch::Tensor& sums, c10::intrusive_ptr<RouterRecord> record) {
    ctx->saved_data["record"] = c10::IValue::make_capsule(std::move(record));
    return sums.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    record_of(ctx)->set_sums_grad(grads[0].detach());
    return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor new_parameter(c10::IntArrayRef shape, Materialize materialize) {
  return materialize == Materialize::kYes ? torch::zeros(shape)
                                          : unmaterialized(shape, torch::kFloat);
}

}  // namespace

torch::Tensor expert_linear(const torch::Tensor& rows, const torch::Tensor& weight,
                            const torch::Tensor& ends, bool grouped) {
  const torch::Tensor transposed = weight.transpose(1, 2);  // [E, in, out]
  if (grouped && grouped_strides(rows) && grouped_strides(transposed)) {
    return at::_grouped_mm(rows, transposed, ends);
  }
  const torch::Tensor at_end = ends.to(torch::kCPU, torch::kInt64);
  const int64_t* end = at_end.data_ptr<int64_t>();
  std::vector<torch::Tensor> parts;
  int64_t begin = 0;
  for (int64_t e = 0; e < weight.size(0); ++e) {
    if (end[e] > begin)
      parts.push_back(at::linear(rows.narrow(0, begin, end[e] - begin), weight[e]));
    begin = end[e];
  }
  // No rows (an expert-parallel rank whose experts no token chose): still a product, so that the
  // backward reaches what comes before it on every rank.
  if (parts.empty()) return at::linear(rows, weight.select(0, 0));
  return torch::cat(parts);
}

torch::Tensor experts_mlp(const torch::Tensor& rows, const torch::Tensor& gate_up,
                          const torch::Tensor& down, const torch::Tensor& ends, bool grouped,
                          ExpertsAdapter* gate_up_adapter, ExpertsAdapter* down_adapter) {
  torch::Tensor h = expert_linear(rows, gate_up, ends, grouped);
  if (gate_up_adapter != nullptr) h = h + gate_up_adapter->delta(rows, ends, grouped);
  const int64_t width = down.size(2);
  const torch::Tensor a = swiglu(h.narrow(1, 0, width), h.narrow(1, width, width));
  torch::Tensor y = expert_linear(a, down, ends, grouped);
  if (down_adapter != nullptr) y = y + down_adapter->delta(a, ends, grouped);
  return y;
}

bool grouped_experts_on(const torch::Tensor& rows) {
  if (!fused_path_on(FusedPath::kGroupedExperts)) return false;
  return rows.is_cpu() || (rows.scalar_type() == torch::kBFloat16 && use_fused_kernels(rows));
}

ExpertsImpl::ExpertsImpl(int64_t experts, int64_t hidden, int64_t width, Materialize materialize) {
  gate_up_proj =
      register_parameter("gate_up_proj", new_parameter({experts, 2 * width, hidden}, materialize));
  down_proj = register_parameter("down_proj", new_parameter({experts, hidden, width}, materialize));
}

torch::Tensor ExpertsImpl::forward(const torch::Tensor& rows, const torch::Tensor& ends) {
  return experts_mlp(rows, gate_up_proj, down_proj, ends, grouped_experts_on(rows),
                     gate_up_adapter.get(), down_adapter.get());
}

torch::Tensor ExpertsImpl::stack(const std::string& parameter) const {
  if (parameter == "gate_up_proj") return gate_up_proj;
  if (parameter == "down_proj") return down_proj;
  fail(ErrorKind::kInternal, "an expert stack named {}", parameter);
}

std::shared_ptr<ExpertsAdapter>& ExpertsImpl::adapter(const std::string& parameter) {
  if (parameter == "gate_up_proj") return gate_up_adapter;
  if (parameter == "down_proj") return down_adapter;
  fail(ErrorKind::kInternal, "an expert stack named {}", parameter);
}

Routed route(const torch::Tensor& experts, int64_t num_experts) {
  const int64_t k = experts.size(1);
  const torch::Tensor flat = experts.reshape({-1});
  Routed r;
  r.order = std::get<1>(flat.sort(std::optional<bool>(true), /*dim=*/0));
  r.tokens = r.order.div(k, "floor");
  r.ends = flat.bincount({}, num_experts).cumsum(0).to(torch::kInt32);
  r.inverse = torch::empty_like(r.order).scatter_(0, r.order,
                                                  torch::arange(flat.numel(), r.order.options()));
  return r;
}

RouterLosses router_losses(const RouterTotals& t) {
  const int64_t E = t.counts.size(0);
  const torch::Tensor rows = t.rows.clamp_min(1);
  const torch::Tensor probability = t.sums.narrow(0, 0, E) / rows;
  return {(t.counts / rows * probability).sum() * static_cast<double>(E), t.sums[E] / rows};
}

torch::Tensor RouterLosses::weighted(const MoeConfig& moe) const {
  torch::Tensor sum = torch::zeros_like(aux);
  if (moe.aux_loss) sum = sum + aux * moe.aux_loss_coef;
  if (moe.z_loss_coef > 0) sum = sum + z * moe.z_loss_coef;
  return sum;
}

RouterRecord::RouterRecord(int64_t layers, bool losses)
    : losses_(losses), load_(static_cast<size_t>(layers)), totals_(static_cast<size_t>(layers)) {}

torch::Tensor RouterRecord::report(int64_t slot, const torch::Tensor& output,
                                   const torch::Tensor& load, const RouterTotals& totals) {
  const auto at = static_cast<size_t>(slot);
  load_.at(at) = load.detach();
  if (!losses_) return output;
  totals_.at(at) = {totals.counts.detach(), totals.sums.detach(), totals.rows.detach()};
  if (!totals.sums.requires_grad()) return output;
  return RouterGradient::apply(output, totals.sums, held(this));
}

torch::Tensor RouterRecord::load() const {
  const auto reported = [](const torch::Tensor& t) { return t.defined(); };
  const auto first = std::find_if(load_.begin(), load_.end(), reported);
  if (first == load_.end()) return {};
  std::vector<torch::Tensor> rows;
  for (const torch::Tensor& t : load_) rows.push_back(t.defined() ? t : torch::zeros_like(*first));
  return torch::stack(rows);
}

RouterTotals RouterRecord::pooled() const {
  RouterTotals sum;
  if (!losses_) return sum;
  const auto add = [&sum](const RouterTotals& t) {
    if (!t.defined()) return;
    if (!sum.defined()) {
      sum = {t.counts.clone(), t.sums.clone(), t.rows.clone()};
      return;
    }
    sum.counts.add_(t.counts);
    sum.sums.add_(t.sums);
    sum.rows.add_(t.rows);
  };
  add(incoming_);
  for (const RouterTotals& t : totals_) add(t);
  return sum;
}

RouterTotals RouterRecord::totals(const torch::Tensor& last) {
  RouterTotals sum = pooled();
  if (sum.defined() && last.requires_grad()) {
    sum.sums = RouterSink::apply(last, sum.sums, held(this));
  }
  return sum;
}

void RouterRecord::set_incoming(const torch::Tensor& packed) {
  incoming_ = unpack(packed);
}

torch::Tensor RouterRecord::outgoing() const {
  const RouterTotals sum = pooled();
  return sum.defined() ? pack(sum) : torch::Tensor();
}

torch::Tensor RouterRecord::pack(const RouterTotals& t) {
  return torch::cat({t.counts, t.sums, t.rows.reshape({1})}).to(torch::kFloat);
}

RouterTotals RouterRecord::unpack(const torch::Tensor& packed) {
  const int64_t E = (packed.numel() - 2) / 2;
  const torch::Tensor p = packed.detach().to(torch::kFloat);
  return {p.narrow(0, 0, E).clone(), p.narrow(0, E, E + 1).clone(), p[2 * E + 1].clone()};
}

torch::Tensor expert_parallel_mlp(ExpertParallel& ep, ExpertsImpl& experts,
                                  const torch::Tensor& rows, const torch::Tensor& ends,
                                  int64_t slot) {
  const int64_t P = ep.size();
  const int64_t L = experts.gate_up_proj.size(0);  // this rank's experts
  const torch::Tensor counts = torch::diff(ends, 1, 0, ends.new_zeros({1})).to(torch::kDouble);
  const torch::Tensor got = ep.exchange_counts(counts.view({P, L}));
  // The one host synchronisation: the splits of both exchanges.
  const torch::Tensor both = torch::stack({counts.view({P, L}), got}).to(torch::kCPU, torch::kLong);
  const torch::Tensor to_ranks = both[0].sum(1), from_ranks = both[1].sum(1);
  const std::vector<int64_t> send(to_ranks.data_ptr<int64_t>(), to_ranks.data_ptr<int64_t>() + P);
  const std::vector<int64_t> receive(from_ranks.data_ptr<int64_t>(),
                                     from_ranks.data_ptr<int64_t>() + P);
  try {
    const torch::Tensor in = ep.exchange_rows(rows, receive, send);  // by source rank, then expert
    // Sorted by local expert (stably: by source rank within one).
    const torch::Tensor expert_of_row =
        torch::arange(L, torch::kLong).repeat({P}).repeat_interleave(both[1].reshape({-1}));
    const torch::Tensor order =
        std::get<1>(expert_of_row.sort(std::optional<bool>(true), /*dim=*/0)).to(rows.device());
    const torch::Tensor local_ends = both[1].sum(0).cumsum(0).to(rows.device(), torch::kInt32);
    const torch::Tensor out = experts.forward(in.index_select(0, order), local_ends);
    const torch::Tensor inverse =
        torch::empty_like(order).scatter_(0, order, torch::arange(order.numel(), order.options()));
    return ep.exchange_rows(out.index_select(0, inverse), send, receive);
  } catch (const c10::OutOfMemoryError& e) {
    C10_THROW_ERROR(
        OutOfMemoryError,
        fmt::format("MoE layer {} (expert-parallel rank {} of {}): out of memory on the "
                    "{} token rows its {} experts received (from each rank: {}); {}",
                    slot, ep.rank(), P, from_ranks.sum().item<int64_t>(), L,
                    fmt::join(receive, ", "), e.what_without_backtrace()));
  }
}

SparseMoeImpl::SparseMoeImpl(const ModelConfig& c, Materialize m, int64_t slot, ExpertParallel* ep)
    : ep_(ep),
      experts_(c.moe.experts),
      slot_(slot),
      top_k_(c.moe.top_k),
      norm_topk_prob_(c.moe.norm_topk_prob),
      float32_router_(c.moe.float32_router),
      float32_weights_(c.moe.float32_weights) {
  const int64_t C = c.hidden_size;
  gate = register_module("gate", Linear(C, c.moe.experts, /*bias=*/false, m));
  if (ep != nullptr && c.moe.experts % ep->size() != 0) {
    fail(ErrorKind::kInternal, "{} experts over {} expert-parallel ranks", c.moe.experts,
         ep->size());
  }
  const int64_t local = ep != nullptr ? c.moe.experts / ep->size() : c.moe.experts;
  experts = register_module("experts", Experts(local, C, c.moe.expert_size, m));
  if (c.moe.shared_expert_size > 0) {
    shared_expert = register_module("shared_expert", Mlp(c, m, nullptr, c.moe.shared_expert_size));
    shared_expert_gate = register_module("shared_expert_gate", Linear(C, 1, /*bias=*/false, m));
  }
}

torch::Tensor SparseMoeImpl::forward(const torch::Tensor& input, RouterRecord* record,
                                     const torch::Tensor& real) {
  const int64_t C = input.size(-1);
  const torch::Tensor x = input.reshape({-1, C});
  const torch::Tensor logits =
      float32_router_ && x.scalar_type() != torch::kFloat
          ? at::linear(x.to(torch::kFloat), gate->active_weight().to(torch::kFloat))
          : at::linear(x, gate->active_weight());  // [N, E]
  torch::Tensor probabilities = torch::softmax(logits, -1, torch::kFloat);
  auto [top, chosen] = probabilities.topk(top_k_, -1);
  if (norm_topk_prob_) top = top / top.sum(-1, /*keepdim=*/true);
  if (!float32_weights_) top = top.to(logits.scalar_type());
  const Routed r = route(chosen, experts_);
  const torch::Tensor weights = top.reshape({-1}).index_select(0, r.order);
  const torch::Tensor rows = x.index_select(0, r.tokens);
  const torch::Tensor computed =
      ep_ != nullptr ? expert_parallel_mlp(*ep_, *experts, rows, r.ends) : experts(rows, r.ends);
  const torch::Tensor y = computed * weights.unsqueeze(-1);
  torch::Tensor out =
      y.to(x.scalar_type()).index_select(0, r.inverse).view({x.size(0), top_k_, C}).sum(1);
  if (!shared_expert.is_empty()) {
    out = out + torch::sigmoid(at::linear(x, shared_expert_gate->active_weight())) *
                    shared_expert->forward(x);
  }
  out = out.view(input.sizes());
  if (record == nullptr) return out;
  const int64_t E = experts_;
  const torch::Tensor load =
      torch::diff(r.ends, 1, 0, r.ends.new_zeros({1})).to(torch::kFloat);  // [E]
  RouterTotals totals;
  if (record->losses()) {
    // transformers' load_balancing_loss_func: the choices and probabilities of the tokens its
    // attention mask keeps; the z-loss's logsumexp in float32.
    const torch::Tensor squared = torch::logsumexp(logits.to(torch::kFloat), -1).square();
    if (real.defined()) {
      const torch::Tensor keep = real.reshape({-1}).to(torch::kFloat);
      totals.counts = torch::zeros({E}, keep.options())
                          .index_add_(0, chosen.reshape(-1), keep.repeat_interleave(top_k_));
      totals.sums = torch::cat(
          {(probabilities * keep.unsqueeze(-1)).sum(0), (squared * keep).sum().reshape({1})});
      totals.rows = keep.sum();
    } else {
      totals.counts = load;
      totals.sums = torch::cat({probabilities.sum(0), squared.sum().reshape({1})});
      totals.rows = torch::full({}, static_cast<double>(x.size(0)), load.options());
    }
  }
  return record->report(slot_, out, load, totals);
}

}  // namespace dstrain::model
