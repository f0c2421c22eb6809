#include "model/sliding_window_attention.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/autograd.h>

#include "core/error.h"

namespace dstrain::model {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One tile: query rows [begin, begin + rows) and the keys they see, [first_key, first_key + keys).
// The band of a full tile starts at begin - window + 1; early tiles start at key 0 instead, which
// is their mask's columns from mask_offset on.
struct Tile {
  int64_t begin = 0, rows = 0, first_key = 0, keys = 0, mask_offset = 0;
};

struct Tiling {
  int64_t seq_len = 0, window = 0, tile = 0;

  int64_t count() const { return (seq_len + tile - 1) / tile; }
  Tile at(int64_t index) const {
    Tile t;
    t.begin = index * tile;
    t.rows = std::min(tile, seq_len - t.begin);
    const int64_t band_start = t.begin - window + 1;
    t.first_key = std::max<int64_t>(0, band_start);
    t.keys = t.begin + t.rows - t.first_key;
    t.mask_offset = t.first_key - band_start;
    return t;
  }
};

// The additive mask of a full tile, [tile, tile + window - 1] with `options` (q's dtype and
// device): row a (query begin + a) sees column b (key begin - window + 1 + b) iff
// a <= b <= a + window - 1, i.e. query - window < key <= query. 0 there, -inf elsewhere.
Tensor band_mask(const Tiling& tiling, const torch::TensorOptions& options) {
  const auto index = torch::TensorOptions().dtype(torch::kLong).device(options.device());
  const Tensor rows = torch::arange(tiling.tile, index).unsqueeze(1);
  const Tensor cols = torch::arange(tiling.tile + tiling.window - 1, index).unsqueeze(0);
  const Tensor lag = cols - rows;
  const Tensor hidden = lag.lt(0) | lag.ge(tiling.window);
  return torch::zeros(hidden.sizes(), options)
      .masked_fill_(hidden, -std::numeric_limits<double>::infinity());
}

// A tile's attention: q [B, H, rows, D] against k, v [B, H, keys, D] → [B, H, rows, D].
Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
              const Tile& t) {
  const Tensor m = mask.narrow(0, 0, t.rows).narrow(1, t.mask_offset, t.keys);
  return at::scaled_dot_product_attention(q, k, v, m, /*dropout_p=*/0.0, /*is_causal=*/false);
}

// Forward only (no graph): the tiles' outputs concatenated along T.
Tensor tiled_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tiling& tiling) {
  const Tensor mask = band_mask(tiling, q.options());
  std::vector<Tensor> out;
  for (int64_t i = 0; i < tiling.count(); ++i) {
    const Tile t = tiling.at(i);
    out.push_back(attend(q.narrow(2, t.begin, t.rows), k.narrow(2, t.first_key, t.keys),
                         v.narrow(2, t.first_key, t.keys), mask, t));
  }
  return torch::cat(out, 2);
}

// Removes and returns what forward stored; a second backward finds it gone.
std::vector<Tensor> take_saved(AutogradContext* ctx, const std::string& key) {
  auto it = ctx->saved_data.find(key);
  if (it == ctx->saved_data.end()) {
    fail(ErrorKind::kInternal,
         "sliding_window_attention: backward ran twice (its graph is freed by the first)");
  }
  std::vector<Tensor> out = it->second.toTensorVector();
  ctx->saved_data.erase(it);
  return out;
}

struct SlidingWindowAttention : torch::autograd::Function<SlidingWindowAttention> {
  // Records one graph per tile (grad mode back on inside), over leaves that are detached views of
  // q, k, v: saved are those graphs (SDPA keeps its inputs, output and statistics), not copies.
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        int64_t window, int64_t tile) {
    const Tiling tiling{q.size(2), window, tile};
    const Tensor mask = band_mask(tiling, q.options());
    std::vector<Tensor> leaves, outputs;  // leaves: q, k, v views per tile
    {
      torch::AutoGradMode grad_mode(true);
      for (int64_t i = 0; i < tiling.count(); ++i) {
        const Tile t = tiling.at(i);
        leaves.push_back(q.detach().narrow(2, t.begin, t.rows).requires_grad_(needs(ctx, 0)));
        leaves.push_back(k.detach().narrow(2, t.first_key, t.keys).requires_grad_(needs(ctx, 1)));
        leaves.push_back(v.detach().narrow(2, t.first_key, t.keys).requires_grad_(needs(ctx, 2)));
        const size_t n = leaves.size();
        outputs.push_back(attend(leaves[n - 3], leaves[n - 2], leaves[n - 1], mask, t));
      }
    }
    std::vector<Tensor> detached;
    for (const Tensor& o : outputs) detached.push_back(o.detach());
    ctx->saved_data["leaves"] = leaves;
    ctx->saved_data["outputs"] = outputs;
    ctx->saved_data["seq_len"] = tiling.seq_len;
    ctx->saved_data["window"] = window;
    ctx->saved_data["tile"] = tile;
    ctx->saved_data["k_sizes"] = k.sizes().vec();
    ctx->saved_data["v_sizes"] = v.sizes().vec();
    return torch::cat(detached, 2);
  }

  // grad_outputs[0]: dL/d out [B, H, T, D]. Returns dq, dk, dv (undefined where not needed).
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const std::vector<Tensor> leaves = take_saved(ctx, "leaves");
    std::vector<Tensor> outputs = take_saved(ctx, "outputs");
    const Tiling tiling{ctx->saved_data["seq_len"].toInt(), ctx->saved_data["window"].toInt(),
                        ctx->saved_data["tile"].toInt()};
    const Tensor& g = grad_outputs[0];
    const bool reduced = g.scalar_type() == torch::kBFloat16 || g.scalar_type() == torch::kHalf;
    const auto sum_options = reduced ? g.options().dtype(torch::kFloat) : g.options();
    Tensor dq, dk, dv;
    if (needs(ctx, 0)) dq = torch::empty(g.sizes(), g.options());
    if (needs(ctx, 1)) dk = torch::zeros(ctx->saved_data["k_sizes"].toIntVector(), sum_options);
    if (needs(ctx, 2)) dv = torch::zeros(ctx->saved_data["v_sizes"].toIntVector(), sum_options);
    for (int64_t i = 0; i < tiling.count(); ++i) {
      const Tile t = tiling.at(i);
      variable_list inputs;
      for (size_t j = 0; j < 3; ++j)
        if (needs(ctx, j)) inputs.push_back(leaves[static_cast<size_t>(i) * 3 + j]);
      const auto out = static_cast<size_t>(i);
      const variable_list r =
          torch::autograd::grad({outputs[out]}, inputs, {g.narrow(2, t.begin, t.rows)});
      outputs[out].reset();
      size_t n = 0;
      if (dq.defined()) dq.narrow(2, t.begin, t.rows).copy_(r[n++]);
      if (dk.defined()) dk.narrow(2, t.first_key, t.keys).add_(r[n++]);
      if (dv.defined()) dv.narrow(2, t.first_key, t.keys).add_(r[n++]);
    }
    if (dk.defined()) dk = dk.to(g.scalar_type());
    if (dv.defined()) dv = dv.to(g.scalar_type());
    return {dq, dk, dv, Tensor(), Tensor()};
  }

  static bool needs(AutogradContext* ctx, size_t input) { return ctx->needs_input_grad(input); }
};

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window) {
  const bool ok = q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(2) == q.size(2) &&
                  v.size(2) == q.size(2) && k.size(1) == q.size(1) && v.size(1) == q.size(1) &&
                  window > 0;
  if (!ok) {
    fail(ErrorKind::kInternal,
         "sliding_window_attention: q {}, k {}, v {}, window {} do not fit (expected [B, H, T, D] "
         "each with one H and T, window > 0)",
         c10::str(q.sizes()), c10::str(k.sizes()), c10::str(v.sizes()), window);
  }
}

}  // namespace

Tensor sliding_window_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t window,
                                int64_t query_tile) {
  check_inputs(q, k, v, window);
  const int64_t T = q.size(2);
  if (T <= window) {
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true);
  }
  const int64_t tile = query_tile > 0 ? query_tile : std::min(window, kDefaultQueryTile);
  const bool wants_grad = torch::GradMode::is_enabled() &&
                          (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (wants_grad) return SlidingWindowAttention::apply(q, k, v, window, tile);
  return tiled_forward(q, k, v, Tiling{T, window, tile});
}

}  // namespace dstrain::model
