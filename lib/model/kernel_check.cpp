#include "model/kernel_check.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "core/error.h"
#include "kernels/fused_ops.h"
#include "model/document_attention.h"
#include "model/fused_qkv.h"
#include "model/moe.h"
#include "model/rope.h"

namespace dstrain::model {
namespace {

using torch::Tensor;
using Tensors = std::vector<Tensor>;
using PathFunction = std::function<Tensors(const Tensors&)>;

// One input of a path: its values (float32, on the CPU, before rounding to the run's dtype) and
// whether the check takes its gradient.
struct Input {
  std::string name;
  Tensor value;
  bool grad = true;
};

// One fused path: its inputs, the fused run, the eager ops it replaces and the exact formulas
// (evaluated in float64; empty: the eager ops themselves).
struct PathCase {
  FusedPath path = FusedPath::kAddRmsNorm;
  int64_t rows = 0;
  std::vector<Input> inputs;
  std::vector<std::string> outputs;
  PathFunction fused, eager, exact;
};

class Draw {
 public:
  explicit Draw(uint64_t seed) : gen_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}
  Tensor normal(std::vector<int64_t> shape, double scale = 1.0, double mean = 0.0) {
    return torch::randn(shape, gen_, torch::kFloat) * scale + mean;
  }

 private:
  at::Generator gen_;
};

// The outputs of `f` and the gradients of the inputs that take one (for the output gradients
// `grad_outputs`, drawn at the first call from the outputs' shapes), all float64. Inputs and
// output gradients are rounded to `round_to` first, then given to `f` in `compute`.
Tensors run_path(const PathCase& c, const PathFunction& f, torch::ScalarType round_to,
                 torch::ScalarType compute, const torch::Device& device, Tensors& grad_outputs,
                 Draw& draw) {
  Tensors in, need;
  for (const Input& i : c.inputs) {
    Tensor t = i.value.to(round_to).to(device, compute);
    if (i.grad) {
      t.requires_grad_(true);
      need.push_back(t);
    }
    in.push_back(t);
  }
  const Tensors out = f(in);
  if (grad_outputs.empty()) {
    for (const Tensor& o : out) grad_outputs.push_back(draw.normal(o.sizes().vec()));
  }
  Tensors g;
  for (size_t k = 0; k < out.size(); ++k) {
    g.push_back(grad_outputs[k].to(round_to).to(device, out[k].scalar_type()));
  }
  const Tensors grads = torch::autograd::grad(out, need, g, /*retain_graph=*/false,
                                              /*create_graph=*/false, /*allow_unused=*/true);
  Tensors all;
  for (const Tensor& o : out) all.push_back(o.detach().to(torch::kDouble));
  for (size_t k = 0; k < grads.size(); ++k) {
    all.push_back(grads[k].defined() ? grads[k].to(torch::kDouble)
                                     : torch::zeros_like(need[k], torch::kDouble));
  }
  return all;
}

FusedCheck compare(const PathCase& c, const FusedCheckShapes& s,
                   const std::optional<PlantedFault>& fault) {
  Draw draw(0x5eed0000u + static_cast<uint64_t>(c.path));
  Tensors grad_outputs;
  const Tensors eager = run_path(c, c.eager, s.dtype, s.dtype, s.device, grad_outputs, draw);
  FusedCheck r;
  r.path = c.path;
  r.rows = c.rows;
  Tensors fused;
  try {
    fused = run_path(c, c.fused, s.dtype, s.dtype, s.device, grad_outputs, draw);
  } catch (const c10::Error& e) {
    // A kernel the card or the library refuses at these shapes fails the check, not the run.
    r.error = std::numeric_limits<double>::infinity();
    r.tensor = std::string("raised: ") + e.what_without_backtrace();
    return r;
  }
  const Tensors exact = run_path(c, c.exact ? c.exact : c.eager, s.dtype, torch::kDouble, s.device,
                                 grad_outputs, draw);
  const double eps = dtype_eps(s.dtype);
  if (fault && fault->path == c.path) {
    for (Tensor& t : fused) t = t * (1.0 + fault->ulps * eps);
  }
  std::vector<std::string> names = c.outputs;
  for (const Input& i : c.inputs) {
    if (i.grad) names.push_back("d " + i.name);
  }
  r.passed = true;
  double worst = -1;
  for (size_t k = 0; k < exact.size(); ++k) {
    const double error = (fused[k] - exact[k]).abs().max().item<double>();
    const double eager_error = (eager[k] - exact[k]).abs().max().item<double>();
    const double scale = exact[k].abs().max().item<double>();
    const double bound = 2 * eager_error + 4 * eps * scale;
    const bool ok = std::isfinite(error) && error <= bound;
    const double ratio = !std::isfinite(error) ? std::numeric_limits<double>::infinity()
                         : bound > 0           ? error / bound
                         : error > 0           ? std::numeric_limits<double>::infinity()
                                               : 0.0;
    if (ratio > worst) {
      worst = ratio;
      r.error = error;
      r.bound = bound;
      r.tensor = names[k];
    }
    r.passed = r.passed && ok;
  }
  return r;
}

// The rows of a path whose widest tensor has `width` columns: the run's rows, at most
// kCheckElements elements.
int64_t rows_for(const FusedCheckShapes& s, int64_t width) {
  return std::max<int64_t>(1, std::min(s.rows, kCheckElements / std::max<int64_t>(width, 1)));
}

Tensor rms(const Tensor& s, const Tensor& w, double eps) {
  return w * (s * torch::rsqrt(s.pow(2).mean(-1, /*keepdim=*/true) + eps));
}

PathCase add_rms_norm_case(const FusedCheckShapes& s, Draw& draw) {
  PathCase c;
  c.path = FusedPath::kAddRmsNorm;
  c.rows = rows_for(s, s.hidden);
  c.inputs = {{"x", draw.normal({c.rows, s.hidden})},
              {"delta", draw.normal({c.rows, s.hidden})},
              {"weight", draw.normal({s.hidden}, 0.1, 1.0)}};
  c.outputs = {"sum", "normed"};
  const double eps = s.eps;
  c.fused = [eps](const Tensors& in) {
    auto [sum, out] = add_rms_norm_kernels(in[0], in[1], in[2], eps);
    return Tensors{sum, out};
  };
  c.eager = [eps](const Tensors& in) {
    Tensor sum = in[0] + in[1];
    return Tensors{sum, rms_norm(sum, in[2], eps)};
  };
  c.exact = [eps](const Tensors& in) {
    Tensor sum = in[0] + in[1];
    return Tensors{sum, rms(sum, in[2], eps)};
  };
  return c;
}

PathCase add_projection_case(const FusedCheckShapes& s, Draw& draw) {
  PathCase c;
  c.path = FusedPath::kAddProjection;
  c.rows = rows_for(s, std::max(s.hidden, s.intermediate));
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.intermediate));
  c.inputs = {{"residual", draw.normal({c.rows, s.hidden})},
              {"x", draw.normal({c.rows, s.intermediate})},
              {"weight", draw.normal({s.hidden, s.intermediate}, scale)}};
  c.outputs = {"out"};
  c.fused = [](const Tensors& in) { return Tensors{add_projection_epilogue(in[0], in[1], in[2])}; };
  c.eager = [](const Tensors& in) { return Tensors{in[0] + at::linear(in[1], in[2])}; };
  return c;
}

PathCase qkv_case(const FusedCheckShapes& s, Draw& draw) {
  PathCase c;
  c.path = FusedPath::kQkv;
  const int64_t nq = s.heads * s.head_dim, nkv = s.kv_heads * s.head_dim;
  c.rows = rows_for(s, std::max(s.hidden, nq + 2 * nkv));
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.hidden));
  c.inputs = {{"x", draw.normal({c.rows, s.hidden})},
              {"q_proj.weight", draw.normal({nq, s.hidden}, scale)},
              {"k_proj.weight", draw.normal({nkv, s.hidden}, scale)},
              {"v_proj.weight", draw.normal({nkv, s.hidden}, scale)}};
  if (s.qkv_bias) {
    c.inputs.push_back({"q_proj.bias", draw.normal({nq}, 0.1)});
    c.inputs.push_back({"k_proj.bias", draw.normal({nkv}, 0.1)});
    c.inputs.push_back({"v_proj.bias", draw.normal({nkv}, 0.1)});
  }
  c.outputs = {"q", "k", "v"};
  c.fused = [](const Tensors& in) {
    const bool bias = in.size() == 7;
    const QkvOutputs y =
        fused_qkv(in[0], {in[1], in[2], in[3]},
                  bias ? std::array<Tensor, 3>{in[4], in[5], in[6]} : std::array<Tensor, 3>{});
    return Tensors{y.q, y.k, y.v};
  };
  c.eager = [](const Tensors& in) {
    const bool bias = in.size() == 7;
    Tensors out;
    for (int i = 0; i < 3; ++i)
      out.push_back(at::linear(in[0], in[1 + i], bias ? in[4 + i] : Tensor()));
    return out;
  };
  return c;
}

PathCase rotary_case(const FusedCheckShapes& s, Draw& draw) {
  PathCase c;
  c.path = FusedPath::kRotary;
  const int64_t rows = rows_for(s, s.heads * s.head_dim);
  const int64_t T = std::max<int64_t>(1, std::min(s.seq_len, rows)),
                B = std::max<int64_t>(1, rows / T);
  c.rows = B * T;
  const Tensor inv_freq =
      1.0 / torch::pow(10000.0, torch::arange(0, s.head_dim, 2, torch::kFloat) / s.head_dim);
  const auto [cos, sin] = rope_tables(inv_freq, T);
  c.inputs = {{"x", draw.normal({B, T, s.heads, s.head_dim})},
              {"cos", cos, /*grad=*/false},
              {"sin", sin, /*grad=*/false}};
  c.outputs = {"rotated"};
  c.fused = [](const Tensors& in) { return Tensors{rotary_kernels(in[0], in[1], in[2])}; };
  c.eager = [](const Tensors& in) {
    return Tensors{apply_rope(in[0], in[1].unsqueeze(1), in[2].unsqueeze(1))};
  };
  return c;
}

PathCase swiglu_case(const FusedCheckShapes& s, Draw& draw) {
  PathCase c;
  c.path = FusedPath::kSwiglu;
  c.rows = rows_for(s, s.intermediate);
  c.inputs = {{"gate", draw.normal({c.rows, s.intermediate}, 2.0)},
              {"up", draw.normal({c.rows, s.intermediate})}};
  c.outputs = {"out"};
  c.fused = [](const Tensors& in) { return Tensors{swiglu_kernels(in[0], in[1])}; };
  c.eager = [](const Tensors& in) { return Tensors{torch::silu(in[0]) * in[1]}; };
  return c;
}

// Packed documents' attention by its definition: SDPA with the dense mask of each token's own
// document's earlier tokens (the `window` latest), key/value heads repeated for the query heads.
Tensor dense_document_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Documents& d, std::optional<int64_t> window) {
  const int64_t B = q.size(0), T = q.size(2), groups = q.size(1) / k.size(1);
  Tensor doc = torch::empty({B, T}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0, id = 0;
    for (const int64_t n : d.lengths[static_cast<size_t>(b)]) {
      doc.narrow(0, b, 1).narrow(1, t, n).fill_(id++);
      t += n;
    }
  }
  doc = doc.to(q.device());
  const Tensor i = torch::arange(T, doc.options()).view({1, T, 1});
  const Tensor j = torch::arange(T, doc.options()).view({1, 1, T});
  Tensor mask = j.le(i) & doc.unsqueeze(2).eq(doc.unsqueeze(1));
  if (window) mask = mask & j.gt(i - *window);
  return at::scaled_dot_product_attention(q, k.repeat_interleave(groups, 1),
                                          v.repeat_interleave(groups, 1), mask.unsqueeze(1));
}

// Rows of seq_len positions, each cut into documents of varied lengths (one token, a few, most of
// the row, the whole row), as many rows as the check's size allows.
PathCase varlen_attention_case(const FusedCheckShapes& s, Draw& draw) {
  PathCase c;
  c.path = FusedPath::kVarlenAttention;
  const int64_t T = std::max<int64_t>(2, std::min(s.seq_len, rows_for(s, s.heads * s.head_dim)));
  const int64_t B = std::max<int64_t>(1, rows_for(s, s.heads * s.head_dim) / T);
  c.rows = B * T;
  auto documents = std::make_shared<Documents>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t first = b % 4 == 3 ? T : 1 + (b * 7) % (T - 1);
    std::vector<int64_t> row = {first};
    const int64_t rest = T - first;
    if (rest > 2) {
      row.push_back(rest / 3);
      row.push_back(rest - rest / 3);
    } else if (rest > 0) {
      row.push_back(rest);
    }
    documents->lengths.push_back(row);
  }
  const std::optional<int64_t> window =
      s.sliding_window > 0 ? std::optional<int64_t>(s.sliding_window) : std::nullopt;
  c.inputs = {{"q", draw.normal({B, s.heads, T, s.head_dim})},
              {"k", draw.normal({B, s.kv_heads, T, s.head_dim})},
              {"v", draw.normal({B, s.kv_heads, T, s.head_dim})}};
  c.outputs = {"attention"};
  c.fused = [documents, window](const Tensors& in) {
    return Tensors{in[0].is_cuda()
                       ? varlen_document_attention(in[0], in[1], in[2], *documents, window)
                       : dense_document_attention(in[0], in[1], in[2], *documents, window)};
  };
  c.eager = [documents, window](const Tensors& in) {
    return Tensors{piecewise_document_attention(in[0], in[1], in[2], *documents, window)};
  };
  return c;
}

// Rows spread over the experts by the weights 1, 0 (none), 2, 3, 1, 2, 3, ...: an uneven split
// with an expert that gets no row, whose weight gradient must be exactly the loop's zero.
PathCase grouped_experts_case(const FusedCheckShapes& s, Draw& draw) {
  PathCase c;
  c.path = FusedPath::kGroupedExperts;
  const int64_t C = s.hidden, I = s.expert_size;
  c.rows = rows_for(s, std::max(2 * I, C));
  const int64_t E = std::max<int64_t>(2, std::min(s.experts, kCheckElements / (2 * I * C)));
  std::vector<int64_t> weights;
  for (int64_t e = 0; e < E; ++e) weights.push_back(e == 1 ? 0 : 1 + e % 3);
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int64_t> counts;
  for (const int64_t w : weights)
    counts.push_back(static_cast<int64_t>(static_cast<double>(c.rows) * w / total));
  counts[0] += c.rows - std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const Tensor ends = torch::tensor(counts, torch::kInt64).cumsum(0).to(torch::kInt32);
  c.inputs = {{"rows", draw.normal({c.rows, C})},
              {"gate_up_proj", draw.normal({E, 2 * I, C}, 1.0 / std::sqrt(C))},
              {"down_proj", draw.normal({E, C, I}, 1.0 / std::sqrt(I))}};
  c.outputs = {"out"};
  const auto run = [ends](bool grouped) {
    return [ends, grouped](const Tensors& in) {
      return Tensors{experts_mlp(in[0], in[1], in[2], ends.to(in[0].device()), grouped)};
    };
  };
  c.fused = run(true);
  c.eager = run(false);
  return c;
}

// The check of a path the run does not take at its shapes: passed, saying why.
FusedCheck not_used(FusedPath path, const char* why) {
  FusedCheck r;
  r.path = path;
  r.passed = true;
  r.tensor = why;
  return r;
}

}  // namespace

double dtype_eps(torch::ScalarType t) {
  if (t == torch::kBFloat16) return std::ldexp(1.0, -7);
  if (t == torch::kHalf) return std::ldexp(1.0, -10);
  return std::ldexp(1.0, -23);
}

std::vector<FusedCheck> check_fused_paths(const FusedCheckShapes& shapes,
                                          const std::optional<PlantedFault>& fault) {
  if (shapes.rows <= 0 || shapes.hidden <= 0 || shapes.intermediate <= 0 || shapes.heads <= 0 ||
      shapes.kv_heads <= 0 || shapes.head_dim <= 0 || shapes.seq_len <= 0) {
    fail(ErrorKind::kInternal, "check_fused_paths: every shape must be positive");
  }
  // Its inputs come from generators of its own: the ones training draws from (dropout) are left
  // as they were.
  const torch::AutoGradMode grad_on(true);
  Draw draw(0x5eedu);
  std::vector<FusedCheck> results;
  for (int p = 0; p < kFusedPathCount; ++p) {
    const auto path = static_cast<FusedPath>(p);
    PathCase c;
    switch (path) {
      case FusedPath::kAddRmsNorm:
        if (shapes.hidden > kernels::kAddRmsNormMaxHidden) {
          // The layer takes the eager ops at this width whatever the switch says.
          results.push_back(not_used(path, "not used at this hidden size"));
          continue;
        }
        c = add_rms_norm_case(shapes, draw);
        break;
      case FusedPath::kAddProjection:
        c = add_projection_case(shapes, draw);
        break;
      case FusedPath::kQkv:
        c = qkv_case(shapes, draw);
        break;
      case FusedPath::kRotary:
        c = rotary_case(shapes, draw);
        break;
      case FusedPath::kSwiglu:
        c = swiglu_case(shapes, draw);
        break;
      case FusedPath::kVarlenAttention:
        if (shapes.device.is_cuda() &&
            !use_varlen_attention(
                torch::empty({0, shapes.head_dim},
                             torch::TensorOptions().dtype(shapes.dtype).device(shapes.device)))) {
          results.push_back(not_used(path, "not used at this dtype or head size"));
          continue;
        }
        c = varlen_attention_case(shapes, draw);
        break;
      case FusedPath::kGroupedExperts:
        if (shapes.experts <= 0 || shapes.expert_size <= 0) {
          results.push_back(not_used(path, "not used by a dense model"));
          continue;
        }
        if (!grouped_experts_on(torch::empty(
                {0}, torch::TensorOptions().dtype(shapes.dtype).device(shapes.device)))) {
          results.push_back(not_used(path, "not used at this dtype"));
          continue;
        }
        c = grouped_experts_case(shapes, draw);
        break;
    }
    results.push_back(compare(c, shapes, fault));
  }
  return results;
}

}  // namespace dstrain::model
