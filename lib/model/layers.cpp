#include "model/layers.h"

#include <cmath>
#include <vector>

#include "model/fused_layer_ops.h"
#include "model/fused_qkv.h"
#include "model/selective_attention.h"
#include "model/sliding_window_attention.h"
#include "model/storage.h"
#include "model/tiled_mlp.h"

namespace dstrain::model {
namespace {

// A float32 parameter of `shape`: uninitialised memory, or none at all.
torch::Tensor new_parameter(c10::IntArrayRef shape, Materialize materialize) {
  return materialize == Materialize::kYes ? torch::empty(shape)
                                          : unmaterialized(shape, torch::kFloat);
}

// [B, KV, T, D] -> [B, KV·groups, T, D]: each key/value head serves `groups` consecutive query
// heads.
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t groups) {
  if (groups == 1) return x;
  const auto B = x.size(0), KV = x.size(1), T = x.size(2), D = x.size(3);
  return x.unsqueeze(2).expand({B, KV, groups, T, D}).reshape({B, KV * groups, T, D});
}

// A row-parallel projection's partial products (this rank's slice of the input features, the
// adapter's delta included: tensor_parallel.h) summed over the group, then its bias once.
torch::Tensor leave_row_parallel(const LinearImpl& p, const torch::Tensor& partial,
                                 TensorParallel* tp) {
  const torch::Tensor whole = leave_region(tp, partial);
  if (!p.bias.defined()) return whole;
  // Added to this rank's token rows under sequence parallelism: its gradient there is a part
  // (place_row).
  return whole + p.bias;
}

}  // namespace

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias, Materialize materialize)
    : in_features(in), out_features(out) {
  weight = register_parameter("weight", new_parameter({out, in}, materialize));
  if (with_bias) bias = register_parameter("bias", new_parameter({out}, materialize));
  if (materialize == Materialize::kNo) return;
  // torch::nn::Linear's default initialisation, drawn in the same order from the same generator.
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound = 1 / std::sqrt(static_cast<double>(in));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void LinearImpl::place_column() {
  weight_placement = bias_placement = Placement::split(PlacementKind::kColumn);
}

void LinearImpl::place_row(const TensorParallel& tp) {
  weight_placement = Placement::split(PlacementKind::kRow);
  bias_placement = Placement::replicated_with(tp.sequence_parallel());
}

// ATen's linear, which torch.nn.Linear runs too: a biased projection of contiguous input is one
// addmm over its rows, the bias added before rounding (LibTorch's C++ functional::linear runs a
// matmul and then adds the bias, which in bfloat16 rounds twice).
torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  return at::linear(x, weight, bias);
}

torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, std::optional<int64_t> window,
                               const Documents* documents) {
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  // Inside a selectively checkpointed layer: the output kept by its forward
  // (selective_attention.h). A window the sequence fits in is causal attention, over k and v
  // repeated as below.
  if (AttentionKeep* keep = attention_keep(q, window, documents != nullptr)) {
    const int64_t groups = window ? heads / kv_heads : 1;
    return keep_attention(*keep, q, repeat_kv(k, groups), repeat_kv(v, groups));
  }
  if (documents != nullptr) return document_attention(q, k, v, *documents, window);
  if (window) {
    return sliding_window_attention(q, repeat_kv(k, heads / kv_heads),
                                    repeat_kv(v, heads / kv_heads), *window);
  }
  // Grouped-query attention: SDPA serves each key/value head to its query heads itself
  // (enable_gqa: flash on the CPU, cuDNN/flash on a GPU), without the [B, H, T, D] copies of k and
  // v that repeating them costs, and the sum over the groups in backward.
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true, /*scale=*/std::nullopt,
                                          /*enable_gqa=*/kv_heads != heads);
}

namespace {

// y plus p's adapter's delta for x, if it has one.
torch::Tensor with_delta(const LinearImpl& p, const torch::Tensor& y, const torch::Tensor& x,
                         bool training) {
  return p.adapter ? y + p.adapter->delta(x, training) : y;
}

}  // namespace

torch::Tensor project(const LinearImpl& p, const torch::Tensor& x, bool training,
                      const ProjectionEpilogue& e) {
  const torch::Tensor& bias = e.partial ? torch::Tensor() : p.bias;
  if (e.residual.defined() && !bias.defined() && use_fused_kernels(x)) {
    return with_delta(p, add_projection(e.residual, x, p.weight), x, training);
  }
  const torch::Tensor y = with_delta(p, at::linear(x, p.weight, bias), x, training);
  return e.residual.defined() ? e.residual + y : y;
}

std::array<torch::Tensor, 3> project_qkv(const LinearImpl& q, const LinearImpl& k,
                                         const LinearImpl& v, const torch::Tensor& x,
                                         bool training) {
  if (!use_fused_qkv(x))
    return {project(q, x, training), project(k, x, training), project(v, x, training)};
  const QkvOutputs y = fused_qkv(x, q, k, v);
  return {with_delta(q, y.q, x, training), with_delta(k, y.k, x, training),
          with_delta(v, y.v, x, training)};
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, Materialize materialize) : eps_(eps) {
  weight = register_parameter("weight", materialize == Materialize::kYes
                                            ? torch::ones({dim})
                                            : unmaterialized({dim}, torch::kFloat));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  return rms_norm(x, weight, eps_);
}

std::pair<torch::Tensor, torch::Tensor> RMSNormImpl::add_and_forward(const torch::Tensor& x,
                                                                     const torch::Tensor& delta) {
  return add_rms_norm(x, delta, weight, eps_);
}

AttentionImpl::AttentionImpl(const ModelConfig& c, std::optional<int64_t> window, Materialize m,
                             TensorParallel* tp)
    : heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.head_dim),
      window_(window),
      tp_(tp) {
  const int64_t C = c.hidden_size, q = heads_ * head_dim_, kv = kv_heads_ * head_dim_;
  q_proj = register_module("q_proj", Linear(C, q, c.qkv_bias, m));
  k_proj = register_module("k_proj", Linear(C, kv, c.qkv_bias, m));
  v_proj = register_module("v_proj", Linear(C, kv, c.qkv_bias, m));
  o_proj = register_module("o_proj", Linear(q, C, c.o_bias, m));
  if (tp != nullptr) {
    for (Linear* p : {&q_proj, &k_proj, &v_proj}) (*p)->place_column();
    o_proj->place_row(*tp);
  }
  if (c.qk_norm) {
    q_norm = register_module("q_norm", RMSNorm(head_dim_, c.rms_norm_eps, m));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, c.rms_norm_eps, m));
    // Each rank normalises its own heads: its gradient of the shared weights is its heads' part.
    q_norm->partial_gradient = k_norm->partial_gradient = tp != nullptr;
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& input, const torch::Tensor& cos,
                                     const torch::Tensor& sin, const Documents* documents) {
  torch::Tensor x = enter_region(tp_, input);
  // Sequence parallelism's gathered token rows [B·T, C]: T is the RoPE tables' length.
  if (x.dim() == 2) x = x.view({-1, cos.size(-2), x.size(-1)});
  const int64_t B = x.size(0), T = x.size(1);
  const bool train = is_training();
  auto [q, k, v] = project_qkv(*q_proj, *k_proj, *v_proj, x, train);
  q = q.view({B, T, heads_, head_dim_});
  k = k.view({B, T, kv_heads_, head_dim_});
  v = v.view({B, T, kv_heads_, head_dim_}).transpose(1, 2);
  if (q_norm) {
    q = q_norm(q);
    k = k_norm(k);
  }
  q = rotary(q, cos, sin).transpose(1, 2);  // [B, H, T, D]
  k = rotary(k, cos, sin).transpose(1, 2);  // [B, KV, T, D]
  const torch::Tensor out =
      core ? core(q, k, v, window_, documents) : causal_attention(q, k, v, window_, documents);
  const torch::Tensor heads = out.transpose(1, 2).reshape({B, T, heads_ * head_dim_});
  if (tp_ == nullptr) return project(*o_proj, heads, train);
  return leave_row_parallel(*o_proj, project(*o_proj, heads, train, {{}, /*partial=*/true}), tp_);
}

MlpImpl::MlpImpl(const ModelConfig& c, Materialize m, TensorParallel* tp, int64_t width) : tp_(tp) {
  const int64_t C = c.hidden_size, I = width > 0 ? width : c.intermediate_size;
  gate_proj = register_module("gate_proj", Linear(C, I, c.mlp_bias, m));
  up_proj = register_module("up_proj", Linear(C, I, c.mlp_bias, m));
  down_proj = register_module("down_proj", Linear(I, C, c.mlp_bias, m));
  if (tp != nullptr) {
    gate_proj->place_column();
    up_proj->place_column();
    down_proj->place_row(*tp);
  }
}

torch::Tensor MlpImpl::untiled(const torch::Tensor& x, bool training, const torch::Tensor& residual,
                               bool partial) {
  const torch::Tensor h = swiglu(project(*gate_proj, x, training), project(*up_proj, x, training));
  return project(*down_proj, h, training, {residual, partial});
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x, const torch::Tensor& residual) {
  const int64_t C = x.size(-1);
  if (tp_ == nullptr && mlp_tile_tokens(tiling_, x.numel() / std::max<int64_t>(C, 1), C) == 0) {
    return untiled(x, is_training(), residual);
  }
  return residual + forward(x);
}

torch::Tensor MlpImpl::forward(const torch::Tensor& input) {
  const bool train = is_training();
  const torch::Tensor x = enter_region(tp_, input);
  const bool partial = tp_ != nullptr;
  const int64_t C = x.size(-1);
  const int64_t tile = mlp_tile_tokens(tiling_, x.numel() / std::max<int64_t>(C, 1), C);
  const auto out_of_region = [&](const torch::Tensor& y) {
    return partial ? leave_row_parallel(*down_proj, y, tp_) : y;
  };
  if (tile == 0) return out_of_region(untiled(x, train, {}, partial));
  // The closure holds the module (not `this`): the graph may outlive this call.
  auto self = std::static_pointer_cast<MlpImpl>(shared_from_this());
  std::vector<torch::Tensor> params;
  for (const Linear& projection : {gate_proj, up_proj, down_proj}) {
    if (projection->adapter) {
      for (const torch::Tensor& t : projection->adapter->parameters()) params.push_back(t);
    }
  }
  for (const auto& p : parameters()) params.push_back(p);
  const torch::Tensor rows = x.reshape({-1, C});  // [B·T, C]
  const torch::Tensor out =
      tiled_tokenwise([self, train, partial](
                          const torch::Tensor& t) { return self->untiled(t, train, {}, partial); },
                      rows, tile, params);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = out.size(1);
  return out_of_region(out.view(shape));
}

}  // namespace dstrain::model
