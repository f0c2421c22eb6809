#include "model/document_attention.h"

#include <algorithm>
#include <numeric>
#include <string>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "model/fused_layer_ops.h"
#include "model/sliding_window_attention.h"

namespace dstrain::model {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Piece {
  int64_t row = 0, begin = 0, length = 0;
};

std::vector<Piece> pieces_of(const Documents& documents) {
  std::vector<Piece> out;
  for (size_t b = 0; b < documents.lengths.size(); ++b) {
    int64_t begin = 0;
    for (const int64_t n : documents.lengths[b]) {
      out.push_back({static_cast<int64_t>(b), begin, n});
      begin += n;
    }
  }
  return out;
}

Tensor narrow_piece(const Tensor& t, const Piece& p) {
  return t.narrow(0, p.row, 1).narrow(2, p.begin, p.length);
}

// One document's causal attention: q [1, H, n, D], k and v [1, KV, n, D].
Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<int64_t> window) {
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  if (window && q.size(2) > *window) {
    const int64_t groups = heads / kv_heads;
    return sliding_window_attention(q, k.repeat_interleave(groups, 1),
                                    v.repeat_interleave(groups, 1), *window);
  }
  return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                          /*is_causal=*/true, /*scale=*/std::nullopt,
                                          /*enable_gqa=*/kv_heads != heads);
}

struct DocumentAttention : torch::autograd::Function<DocumentAttention> {
  // One graph per piece (grad mode back on inside) over leaves that are detached views of q, k,
  // v: saved are those graphs, not copies.
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Documents* documents, std::optional<int64_t> window) {
    const std::vector<Piece> pieces = pieces_of(*documents);
    std::vector<Tensor> leaves, outputs;
    Tensor out = torch::empty_like(q);
    {
      torch::AutoGradMode grad_mode(true);
      for (const Piece& p : pieces) {
        leaves.push_back(narrow_piece(q.detach(), p).requires_grad_(ctx->needs_input_grad(0)));
        leaves.push_back(narrow_piece(k.detach(), p).requires_grad_(ctx->needs_input_grad(1)));
        leaves.push_back(narrow_piece(v.detach(), p).requires_grad_(ctx->needs_input_grad(2)));
        const size_t n = leaves.size();
        outputs.push_back(attend(leaves[n - 3], leaves[n - 2], leaves[n - 1], window));
      }
    }
    for (size_t i = 0; i < pieces.size(); ++i) {
      narrow_piece(out, pieces[i]).copy_(outputs[i].detach());
    }
    ctx->saved_data["leaves"] = leaves;
    ctx->saved_data["outputs"] = outputs;
    std::vector<int64_t> flat;  // row, begin, length per piece
    for (const Piece& p : pieces) flat.insert(flat.end(), {p.row, p.begin, p.length});
    ctx->saved_data["pieces"] = flat;
    ctx->saved_data["k_sizes"] = k.sizes().vec();
    ctx->saved_data["v_sizes"] = v.sizes().vec();
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto take = [&](const std::string& key) {
      auto it = ctx->saved_data.find(key);
      if (it == ctx->saved_data.end()) {
        fail(ErrorKind::kInternal,
             "document_attention: backward ran twice (its graph is freed by the first)");
      }
      std::vector<Tensor> saved = it->second.toTensorVector();
      ctx->saved_data.erase(it);
      return saved;
    };
    const std::vector<Tensor> leaves = take("leaves");
    std::vector<Tensor> outputs = take("outputs");
    const std::vector<int64_t> flat = ctx->saved_data["pieces"].toIntVector();
    const Tensor& g = grad_outputs[0];
    Tensor dq, dk, dv;
    // The pieces partition every row: each element is written by exactly one of them.
    if (ctx->needs_input_grad(0)) dq = torch::empty(g.sizes(), g.options());
    if (ctx->needs_input_grad(1))
      dk = torch::empty(ctx->saved_data["k_sizes"].toIntVector(), g.options());
    if (ctx->needs_input_grad(2))
      dv = torch::empty(ctx->saved_data["v_sizes"].toIntVector(), g.options());
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Piece p{flat[3 * i], flat[3 * i + 1], flat[3 * i + 2]};
      variable_list inputs;
      for (size_t j = 0; j < 3; ++j) {
        if (ctx->needs_input_grad(j)) inputs.push_back(leaves[3 * i + j]);
      }
      const variable_list r = torch::autograd::grad({outputs[i]}, inputs, {narrow_piece(g, p)});
      outputs[i].reset();
      size_t n = 0;
      if (dq.defined()) narrow_piece(dq, p).copy_(r[n++]);
      if (dk.defined()) narrow_piece(dk, p).copy_(r[n++]);
      if (dv.defined()) narrow_piece(dv, p).copy_(r[n++]);
    }
    return {dq, dk, dv, Tensor(), Tensor()};
  }
};

}  // namespace

void Documents::check(int64_t rows, int64_t seq_len) const {
  bool ok = static_cast<int64_t>(lengths.size()) == rows;
  for (const auto& row : lengths) {
    ok = ok && std::accumulate(row.begin(), row.end(), int64_t{0}) == seq_len &&
         std::all_of(row.begin(), row.end(), [](int64_t n) { return n > 0; });
  }
  if (!ok) {
    fail(ErrorKind::kInternal,
         "packed documents: {} row(s) described for a batch of {} rows of {} tokens (each row's "
         "documents must be positive lengths summing to the row's length)",
         lengths.size(), rows, seq_len);
  }
}

int64_t Documents::longest() const {
  int64_t out = 0;
  for (const auto& row : lengths) {
    for (const int64_t n : row) out = std::max(out, n);
  }
  return out;
}

torch::Tensor Documents::positions(int64_t seq_len) const {
  torch::Tensor out = torch::empty({static_cast<int64_t>(lengths.size()), seq_len}, torch::kLong);
  auto a = out.accessor<int64_t, 2>();
  for (size_t b = 0; b < lengths.size(); ++b) {
    int64_t t = 0;
    for (const int64_t n : lengths[b]) {
      for (int64_t i = 0; i < n && t < seq_len; ++i) a[static_cast<int64_t>(b)][t++] = i;
    }
  }
  return out;
}

std::optional<Documents> Documents::from_position_ids(const torch::Tensor& position_ids) {
  if (position_ids.dim() != 2 || position_ids.size(1) < 1) return std::nullopt;
  const torch::Tensor p = position_ids.to(torch::kCPU, torch::kLong).contiguous();
  auto a = p.accessor<int64_t, 2>();
  Documents d;
  for (int64_t b = 0; b < p.size(0); ++b) {
    std::vector<int64_t> row;
    for (int64_t t = 0; t < p.size(1); ++t) {
      if (a[b][t] == 0) {
        row.push_back(1);
      } else if (!row.empty() && a[b][t] == a[b][t - 1] + 1) {
        ++row.back();
      } else {
        return std::nullopt;
      }
    }
    d.lengths.push_back(std::move(row));
  }
  return d;
}

namespace {

void check_shapes(const Tensor& q, const Tensor& k, const Tensor& v, const Documents& documents,
                  std::optional<int64_t> window) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.size(2) != q.size(2) ||
      q.size(1) % k.size(1) != 0 || (window && *window <= 0)) {
    fail(ErrorKind::kInternal, "document_attention: q {}, k {}, v {} do not fit",
         c10::str(q.sizes()), c10::str(k.sizes()), c10::str(v.sizes()));
  }
  documents.check(q.size(0), q.size(2));
}

// FlashAttention's variable-length kernels over every piece at once: q, k, v as [B·T, heads, D]
// (the pieces back to back, as the rows are), the pieces' cumulative lengths as int32 on the
// device. A window of w tokens (itself included) is its left size w - 1.
std::optional<c10::SymInt> window_left(int64_t window) {
  if (window <= 0) return std::nullopt;
  return c10::SymInt(window - 1);
}

std::optional<c10::SymInt> window_right(int64_t window) {
  if (window <= 0) return std::nullopt;
  return c10::SymInt(0);
}

struct VarlenAttention : torch::autograd::Function<VarlenAttention> {
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        const Tensor& cumulative, int64_t longest, int64_t window) {
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), KV = k.size(1);
    const Tensor fq = q.transpose(1, 2).reshape({B * T, H, D});
    const Tensor fk = k.transpose(1, 2).reshape({B * T, KV, D});
    const Tensor fv = v.transpose(1, 2).reshape({B * T, KV, D});
    auto [out, lse, rng_state, unused, debug] = at::_flash_attention_forward_symint(
        fq, fk, fv, cumulative, cumulative, longest, longest, /*dropout_p=*/0.0,
        /*is_causal=*/true, /*return_debug_mask=*/false, /*scale=*/std::nullopt,
        window_left(window), window_right(window));
    ctx->save_for_backward({fq, fk, fv, out, lse, cumulative, rng_state, unused});
    ctx->saved_data["longest"] = longest;
    ctx->saved_data["window"] = window;
    return out.view({B, T, H, D}).transpose(1, 2);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto s = ctx->get_saved_variables();
    const Tensor &fq = s[0], &fk = s[1], &fv = s[2];
    const int64_t longest = ctx->saved_data["longest"].toInt();
    const int64_t window = ctx->saved_data["window"].toInt();
    const int64_t B = grad[0].size(0), H = grad[0].size(1), T = grad[0].size(2),
                  D = grad[0].size(3), KV = fk.size(1);
    const Tensor g = grad[0].transpose(1, 2).reshape({B * T, H, D});
    auto [dq, dk, dv] = at::_flash_attention_backward_symint(
        g, fq, fk, fv, s[3], s[4], s[5], s[5], longest, longest, /*dropout_p=*/0.0,
        /*is_causal=*/true, s[6], s[7], /*scale=*/std::nullopt, window_left(window),
        window_right(window));
    return {dq.view({B, T, H, D}).transpose(1, 2),
            dk.view({B, T, KV, D}).transpose(1, 2),
            dv.view({B, T, KV, D}).transpose(1, 2),
            Tensor(),
            Tensor(),
            Tensor()};
  }
};

}  // namespace

bool use_varlen_attention(const Tensor& q) {
  const auto dtype = q.scalar_type();
  return q.is_cuda() && (dtype == torch::kBFloat16 || dtype == torch::kHalf) &&
         q.size(-1) % 8 == 0 && q.size(-1) <= 256 && use_fused_kernels(q) &&
         fused_path_on(FusedPath::kVarlenAttention);
}

Tensor varlen_document_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                 const Documents& documents, std::optional<int64_t> window) {
  check_shapes(q, k, v, documents, window);
  std::vector<int32_t> cumulative = {0};
  for (const Piece& p : pieces_of(documents)) {
    cumulative.push_back(cumulative.back() + static_cast<int32_t>(p.length));
  }
  // Page-locked and copied without a host wait: the device is not synchronised per layer.
  Tensor host = torch::tensor(cumulative, torch::kInt32);
  if (q.is_cuda()) host = host.pin_memory();
  const Tensor device_cumulative = host.to(q.device(), /*non_blocking=*/true);
  return VarlenAttention::apply(q, k, v, device_cumulative, documents.longest(),
                                window.value_or(0));
}

Tensor piecewise_document_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Documents& documents, std::optional<int64_t> window) {
  check_shapes(q, k, v, documents, window);
  const bool wants_grad = torch::GradMode::is_enabled() &&
                          (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (wants_grad) return DocumentAttention::apply(q, k, v, &documents, window);
  Tensor out = torch::empty_like(q);
  for (const Piece& p : pieces_of(documents)) {
    narrow_piece(out, p).copy_(
        attend(narrow_piece(q, p), narrow_piece(k, p), narrow_piece(v, p), window));
  }
  return out;
}

Tensor document_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Documents& documents, std::optional<int64_t> window) {
  return use_varlen_attention(q) ? varlen_document_attention(q, k, v, documents, window)
                                 : piecewise_document_attention(q, k, v, documents, window);
}

}  // namespace dstrain::model
