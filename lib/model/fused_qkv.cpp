#include "model/fused_qkv.h"

#include <atomic>

#include <c10/util/strides.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "model/fused_layer_ops.h"
#include "model/layers.h"

namespace dstrain::model {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::atomic<int> fused_everywhere{0};

// The concatenation of `parts` along dimension 0: a view when they are adjacent, else a new tensor
// (the caller drops it as soon as the product is done).
Tensor stacked_rows(const std::vector<Tensor>& parts) {
  if (!adjacent_rows(parts)) return torch::cat(parts, 0);
  std::vector<int64_t> sizes = parts.front().sizes().vec();
  for (size_t i = 1; i < parts.size(); ++i) sizes[0] += parts[i].size(0);
  return parts.front().as_strided(sizes, c10::contiguous_strides(sizes),
                                  parts.front().storage_offset());
}

// inputs: x [..., C], Wq, Wk, Wv [n_i, C], then optionally bq, bk, bv [n_i]. Outputs q, k, v
// [..., n_i], views of one [..., Σn_i] product. Saved: x and the weights themselves (no copies).
class QkvFunction : public torch::autograd::Function<QkvFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, at::TensorList inputs) {
    const Tensor& x = inputs[0];
    const std::vector<Tensor> weights{inputs[1], inputs[2], inputs[3]};
    const bool with_bias = inputs.size() == 7;
    const Tensor rows = x.reshape({-1, x.size(-1)});  // [M, C]
    Tensor y;
    {
      const Tensor w = stacked_rows(weights);  // [N, C]
      y = with_bias ? at::addmm(stacked_rows({inputs[4], inputs[5], inputs[6]}), rows, w.t())
                    : at::mm(rows, w.t());  // [M, N]
    }
    ctx->save_for_backward({x, weights[0], weights[1], weights[2]});
    ctx->saved_data["bias"] = with_bias;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = y.size(1);
    y = y.view(shape);
    const int64_t nq = weights[0].size(0), nk = weights[1].size(0), nv = weights[2].size(0);
    return {y.narrow(-1, 0, nq), y.narrow(-1, nq, nk), y.narrow(-1, nq + nk, nv)};
  }

  // grads: d q, d k, d v. Returns d x, d Wq, d Wk, d Wv (views of one product), then d bq, d bk,
  // d bv (views of one sum) when there are biases.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    const std::vector<Tensor> weights{saved[1], saved[2], saved[3]};
    const bool with_bias = ctx->saved_data["bias"].toBool();
    const Tensor rows = x.reshape({-1, x.size(-1)});   // [M, C]
    const Tensor dy = output_grad(grads, weights, x);  // [M, N]
    variable_list out(with_bias ? 7 : 4);
    if (ctx->needs_input_grad(0)) out[0] = dy.mm(stacked_rows(weights)).view(x.sizes());
    if (ctx->needs_input_grad(1) || ctx->needs_input_grad(2) || ctx->needs_input_grad(3)) {
      split_rows(dy.t().mm(rows), weights, ctx, 1, out);
    }
    if (with_bias &&
        (ctx->needs_input_grad(4) || ctx->needs_input_grad(5) || ctx->needs_input_grad(6))) {
      split_rows(dy.sum(0), weights, ctx, 4, out);
    }
    return out;
  }

 private:
  // The three outputs' gradients side by side, [M, N] (one copy, whatever their strides); zeros
  // for an output without one.
  static Tensor output_grad(const variable_list& grads, const std::vector<Tensor>& weights,
                            const Tensor& x) {
    std::vector<Tensor> parts;
    for (size_t i = 0; i < 3; ++i) {
      std::vector<int64_t> shape = x.sizes().vec();
      shape.back() = weights[i].size(0);
      parts.push_back(grads[i].defined() ? grads[i] : torch::zeros(shape, x.options()));
    }
    const Tensor dy = torch::cat(parts, -1);
    return dy.view({-1, dy.size(-1)});
  }

  // Writes the row blocks of `fused` (one per weight) into out[first..first+2], where needed.
  static void split_rows(const Tensor& fused, const std::vector<Tensor>& weights,
                         AutogradContext* ctx, size_t first, variable_list& out) {
    int64_t begin = 0;
    for (size_t i = 0; i < 3; ++i) {
      const int64_t n = weights[i].size(0);
      if (ctx->needs_input_grad(first + i)) out[first + i] = fused.narrow(0, begin, n);
      begin += n;
    }
  }
};

}  // namespace

bool adjacent_rows(const std::vector<Tensor>& parts) {
  if (parts.empty() || !parts.front().defined() || !parts.front().has_storage()) return false;
  const Tensor& first = parts.front();
  const char* next = static_cast<const char*>(first.data_ptr());
  if (next == nullptr) return false;
  for (const Tensor& p : parts) {
    if (!p.defined() || !p.has_storage() || !p.is_contiguous() ||
        p.scalar_type() != first.scalar_type() || p.device() != first.device() ||
        p.dim() != first.dim() || p.sizes().slice(1) != first.sizes().slice(1) ||
        !p.storage().is_alias_of(first.storage()) || p.data_ptr() != next) {
      return false;
    }
    next += p.nbytes();
  }
  return true;
}

QkvOutputs fused_qkv(const Tensor& x, const LinearImpl& q_proj, const LinearImpl& k_proj,
                     const LinearImpl& v_proj) {
  return fused_qkv(x, {q_proj.weight, k_proj.weight, v_proj.weight},
                   {q_proj.bias, k_proj.bias, v_proj.bias});
}

QkvOutputs fused_qkv(const Tensor& x, const std::array<Tensor, 3>& weights,
                     const std::array<Tensor, 3>& biases) {
  std::vector<Tensor> inputs{x, weights[0], weights[1], weights[2]};
  const int defined =
      int{biases[0].defined()} + int{biases[1].defined()} + int{biases[2].defined()};
  if (defined != 0 && defined != 3) {
    fail(ErrorKind::kInternal, "fused q/k/v: {} of the 3 projections have a bias", defined);
  }
  if (defined == 3) inputs.insert(inputs.end(), biases.begin(), biases.end());
  const variable_list out = QkvFunction::apply(at::TensorList(inputs));
  return {out[0], out[1], out[2]};
}

bool use_fused_qkv(const Tensor& x) {
  return fused_everywhere.load() > 0 || (use_fused_kernels(x) && fused_path_on(FusedPath::kQkv));
}

FusedQkvEverywhere::FusedQkvEverywhere() {
  ++fused_everywhere;
}

FusedQkvEverywhere::~FusedQkvEverywhere() {
  --fused_everywhere;
}

}  // namespace dstrain::model
