#include "model/tiled_mlp.h"

#include <ATen/core/ivalue.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "model/rng_state.h"

namespace dstrain::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// fn over the tiles of x, no graph recorded: [n, in] → [n, out].
torch::Tensor forward_tiles(const TokenwiseFn& fn, const torch::Tensor& x, int64_t tile) {
  const int64_t n = x.size(0);
  torch::Tensor out;
  for (int64_t begin = 0; begin < n; begin += tile) {
    const int64_t len = std::min(tile, n - begin);
    const torch::Tensor y = fn(x.narrow(0, begin, len));
    if (!out.defined()) out = torch::empty({n, y.size(1)}, y.options());
    out.narrow(0, begin, len).copy_(y);
  }
  return out;
}

struct Closure : torch::CustomClassHolder {
  TokenwiseFn fn;
  int64_t tile = 0;
  std::vector<torch::Tensor> params;  // the parameter tensors themselves (not saved copies)
  bool x_requires_grad = false;
  RngState rng;
};

class TiledFunction : public torch::autograd::Function<TiledFunction> {
 public:
  // inputs: x, then the parameters (graph inputs only: backward reads them through fn, and takes
  // the gradients with respect to the tensors in the closure, the same objects).
  static torch::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<Closure> closure,
                               at::TensorList inputs) {
    closure->rng = capture_rng(inputs);
    torch::Tensor out = forward_tiles(closure->fn, inputs[0], closure->tile);
    ctx->save_for_backward({inputs[0]});
    ctx->saved_data["closure"] = c10::IValue::make_capsule(std::move(closure));
    return out;
  }

  // grads: [d out]. Returns nothing for the closure, then d x and each parameter's gradient.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto closure =
        c10::static_intrusive_pointer_cast<Closure>(ctx->saved_data["closure"].toCapsule());
    const torch::Tensor x = ctx->get_saved_variables()[0];
    const torch::Tensor& dy = grads[0];
    const std::vector<torch::Tensor>& params = closure->params;
    if (!dy.defined()) return variable_list(2 + params.size());
    torch::Tensor dx = closure->x_requires_grad ? torch::empty_like(x) : torch::Tensor();
    std::vector<torch::Tensor> dparams(params.size());
    replay_rng(closure->rng, {x}, [&] {
      for (int64_t begin = 0; begin < x.size(0); begin += closure->tile) {
        const int64_t len = std::min(closure->tile, x.size(0) - begin);
        tile_backward(*closure, x.narrow(0, begin, len), dy.narrow(0, begin, len), params,
                      dx.defined() ? dx.narrow(0, begin, len) : torch::Tensor(), dparams);
      }
      return 0;
    });
    variable_list result{torch::Tensor(), dx};
    for (size_t i = 0; i < params.size(); ++i) {
      result.push_back(dparams[i].defined() ? dparams[i].to(params[i].scalar_type())
                                            : torch::Tensor());
    }
    return result;
  }

 private:
  // One tile: recompute with grad, differentiate, write d x into dx_tile, add into dparams.
  static void tile_backward(const Closure& closure, const torch::Tensor& x_tile,
                            const torch::Tensor& dy_tile, const std::vector<torch::Tensor>& params,
                            const torch::Tensor& dx_tile, std::vector<torch::Tensor>& dparams) {
    torch::AutoGradMode grad(true);
    const torch::Tensor xt = x_tile.detach().requires_grad_(closure.x_requires_grad);
    const torch::Tensor yt = closure.fn(xt);
    variable_list wrt;
    if (closure.x_requires_grad) wrt.push_back(xt);
    wrt.insert(wrt.end(), params.begin(), params.end());
    const variable_list g = torch::autograd::grad({yt}, wrt, {dy_tile}, /*retain_graph=*/false,
                                                  /*create_graph=*/false, /*allow_unused=*/true);
    size_t k = 0;
    if (closure.x_requires_grad) dx_tile.copy_(g[k++]);
    for (size_t i = 0; i < params.size(); ++i, ++k) {
      if (!g[k].defined()) continue;
      if (!dparams[i].defined()) {
        dparams[i] = g[k].to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
      } else {
        dparams[i].add_(g[k]);
      }
    }
  }
};

}  // namespace

int64_t mlp_tile_tokens(int64_t setting, int64_t tokens, int64_t hidden_size) {
  if (setting == kTiledMlpOff || tokens <= 0) return 0;
  if (setting == kTiledMlpAuto) {
    const int64_t tiles = ceil_div(tokens, std::max<int64_t>(hidden_size, 1));
    return tiles < 2 ? 0 : ceil_div(tokens, tiles);
  }
  if (setting < 0) fail(ErrorKind::kInternal, "tiled MLP: bad setting {}", setting);
  return setting >= tokens ? 0 : setting;
}

torch::Tensor tiled_tokenwise(TokenwiseFn fn, const torch::Tensor& x, int64_t tile_tokens,
                              const std::vector<torch::Tensor>& params) {
  if (x.dim() != 2 || tile_tokens <= 0)
    fail(ErrorKind::kInternal, "tiled_tokenwise: x must be [n, in] and tiles positive");
  std::vector<torch::Tensor> trainable;
  for (const auto& p : params)
    if (p.defined() && p.requires_grad()) trainable.push_back(p);
  const bool x_grad = x.requires_grad();
  if (!torch::GradMode::is_enabled() || (!x_grad && trainable.empty())) {
    torch::NoGradGuard no_grad;
    return forward_tiles(fn, x, tile_tokens);
  }
  auto closure = c10::make_intrusive<Closure>();
  closure->fn = std::move(fn);
  closure->tile = tile_tokens;
  closure->params = trainable;
  closure->x_requires_grad = x_grad;
  std::vector<torch::Tensor> all{x};
  all.insert(all.end(), trainable.begin(), trainable.end());
  return TiledFunction::apply(std::move(closure), at::TensorList(all));
}

}  // namespace dstrain::model
