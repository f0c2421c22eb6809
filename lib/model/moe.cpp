#include "model/moe.h"

#include <vector>

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

// rows [M, in] · weight[e]ᵀ over each expert's rows (`ends` [E] int32) → [M, out].
torch::Tensor grouped_linear(const torch::Tensor& rows, const torch::Tensor& weight,
                             const torch::Tensor& ends) {
  const torch::Tensor transposed = weight.transpose(1, 2);  // [E, in, out]
  if (rows.is_cpu() && grouped_strides(rows) && grouped_strides(transposed)) {
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
  if (parts.empty()) return rows.new_zeros({0, weight.size(1)});
  return torch::cat(parts);
}

torch::Tensor new_parameter(c10::IntArrayRef shape, Materialize materialize) {
  return materialize == Materialize::kYes ? torch::zeros(shape)
                                          : unmaterialized(shape, torch::kFloat);
}

}  // namespace

ExpertsImpl::ExpertsImpl(int64_t experts, int64_t hidden, int64_t width, Materialize materialize) {
  gate_up_proj =
      register_parameter("gate_up_proj", new_parameter({experts, 2 * width, hidden}, materialize));
  down_proj = register_parameter("down_proj", new_parameter({experts, hidden, width}, materialize));
}

torch::Tensor ExpertsImpl::forward(const torch::Tensor& rows, const torch::Tensor& ends) {
  const torch::Tensor gate_up = grouped_linear(rows, gate_up_proj, ends);
  const int64_t width = down_proj.size(2);
  const torch::Tensor h = swiglu(gate_up.narrow(1, 0, width), gate_up.narrow(1, width, width));
  return grouped_linear(h, down_proj, ends);
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

SparseMoeImpl::SparseMoeImpl(const ModelConfig& c, Materialize m)
    : top_k_(c.moe.top_k),
      norm_topk_prob_(c.moe.norm_topk_prob),
      float32_weights_(c.moe.float32_weights) {
  const int64_t C = c.hidden_size;
  gate = register_module("gate", Linear(C, c.moe.experts, /*bias=*/false, m));
  experts = register_module("experts", Experts(c.moe.experts, C, c.moe.expert_size, m));
  if (c.moe.shared_expert_size > 0) {
    shared_expert = register_module("shared_expert", Mlp(c, m, nullptr, c.moe.shared_expert_size));
    shared_expert_gate = register_module("shared_expert_gate", Linear(C, 1, /*bias=*/false, m));
  }
}

torch::Tensor SparseMoeImpl::forward(const torch::Tensor& input) {
  const int64_t C = input.size(-1);
  const torch::Tensor x = input.reshape({-1, C});
  const torch::Tensor logits = at::linear(x, gate->weight);  // [N, E]
  torch::Tensor probabilities = torch::softmax(logits, -1, torch::kFloat);
  auto [top, chosen] = probabilities.topk(top_k_, -1);
  if (norm_topk_prob_) top = top / top.sum(-1, /*keepdim=*/true);
  if (!float32_weights_) top = top.to(logits.scalar_type());
  const Routed r = route(chosen, gate->weight.size(0));
  const torch::Tensor weights = top.reshape({-1}).index_select(0, r.order);
  const torch::Tensor y = experts(x.index_select(0, r.tokens), r.ends) * weights.unsqueeze(-1);
  torch::Tensor out =
      y.to(x.scalar_type()).index_select(0, r.inverse).view({x.size(0), top_k_, C}).sum(1);
  if (!shared_expert.is_empty()) {
    out =
        out + torch::sigmoid(at::linear(x, shared_expert_gate->weight)) * shared_expert->forward(x);
  }
  return out.view(input.sizes());
}

}  // namespace dstrain::model
