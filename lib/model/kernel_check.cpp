#include "model/kernel_check.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "core/error.h"
#include "kernels/fused_ops.h"
#include "model/fused_qkv.h"
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
  Tensors fused = run_path(c, c.fused, s.dtype, s.dtype, s.device, grad_outputs, draw);
  const Tensors eager = run_path(c, c.eager, s.dtype, s.dtype, s.device, grad_outputs, draw);
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
  FusedCheck r;
  r.path = c.path;
  r.rows = c.rows;
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
          FusedCheck r;
          r.path = path;
          r.passed = true;
          r.tensor = "not used at this hidden size";
          results.push_back(r);
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
    }
    results.push_back(compare(c, shapes, fault));
  }
  return results;
}

}  // namespace dstrain::model
