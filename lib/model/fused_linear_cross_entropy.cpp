#include "model/fused_linear_cross_entropy.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/fused_layer_ops.h"
#include "model/tensor_parallel.h"

namespace dstrain::model {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Where a chunk's gradients go: rows of dL/dh [n, C] and the running dL/dW [V, C], both float32;
// an undefined tensor is a gradient nobody wants.
struct ChunkGrads {
  Tensor hidden;
  Tensor weight;
};

// dL/dW += g^T @ h, summed in float32 whatever the compute dtype: g [n, V], h [n, C], dw [V, C].
// On a GPU one bf16/fp16 GEMM accumulates straight into the float32 dw (cuBLAS, float32 output).
// On the CPU, which has no such GEMM, other dtypes go through blocks of vocabulary rows, so that
// the compute-dtype product never needs a second [V, C] buffer.
void accumulate_weight_grad(Tensor& dw, const Tensor& g, const Tensor& h) {
  if (g.scalar_type() == torch::kFloat) {
    dw.addmm_(g.t(), h);
    return;
  }
  if (dw.is_cuda()) {
    at::addmm_out(dw, dw, g.t(), h, torch::kFloat);
    return;
  }
  constexpr int64_t kRows = 8192;
  const int64_t V = dw.size(0);
  for (int64_t begin = 0; begin < V; begin += kRows) {
    const int64_t rows = std::min(kRows, V - begin);
    dw.narrow(0, begin, rows).add_(torch::mm(g.narrow(1, begin, rows).t(), h));
  }
}

// The chunk's summed loss from its logits [n, V], which are then overwritten by the gradient of
// that sum (softmax - onehot on counted rows, 0 on ignored ones) when `grad` is set. On a GPU one
// kernel does it in the logits' dtype (float32 math, two reads and a write of the logits);
// elsewhere the log-probabilities come from the kernel cross_entropy uses (log_softmax of the
// float32 logits), so each token's loss is the unfused one, with at most two [n, V] float32 tensors
// alive.
Tensor logits_loss(Tensor& logits, const Tensor& y, int64_t ignore_index, bool grad) {
  if (use_fused_kernels(logits)) return fused_cross_entropy(logits, y, ignore_index, grad).sum();
  const auto dtype = logits.scalar_type();
  Tensor logp = logits.to(torch::kFloat);
  logits.reset();
  logp = torch::log_softmax(logp, 1);  // [n, V]
  const Tensor ignored = y.eq(ignore_index);
  const Tensor target = y.masked_fill(ignored, 0).unsqueeze(1);  // [n, 1]
  const Tensor loss = logp.gather(1, target).squeeze(1).masked_fill_(ignored, 0).sum().neg_();
  if (!grad) return loss;
  Tensor g = logp.exp_().masked_fill_(ignored.unsqueeze(1), 0);
  g.scatter_add_(1, target, ignored.logical_not().to(torch::kFloat).neg_().unsqueeze(1));
  logits = g.to(dtype);
  return loss;
}

// logits_loss for a rank's vocabulary slice (VocabSlice): logits [n, V/T] of the ids [first,
// first + V/T); the loss of the whole vocabulary, the gradient of this rank's logits.
Tensor sliced_logits_loss(Tensor& logits, const Tensor& y, int64_t ignore_index, bool grad,
                          const VocabSlice& slice) {
  const auto dtype = logits.scalar_type();
  Tensor z = logits.to(torch::kFloat);
  logits.reset();
  Tensor top = std::get<0>(z.max(1));  // [n]
  slice.tp->all_reduce_(top, /*max=*/true);
  z.sub_(top.unsqueeze(1));
  const Tensor ignored = y.eq(ignore_index);
  const Tensor here = y.ge(slice.first)
                          .logical_and_(y.lt(slice.first + z.size(1)))
                          .logical_and_(ignored.logical_not());
  const Tensor target = (y - slice.first).masked_fill_(here.logical_not(), 0).unsqueeze(1);
  // Row 0: Σ exp(z - max) over the slice; row 1: the label's z where this rank holds it.
  Tensor sums = torch::empty({2, z.size(0)}, z.options());
  sums[1].copy_(z.gather(1, target).squeeze(1).masked_fill_(here.logical_not(), 0));
  z.exp_();
  sums[0].copy_(z.sum(1));
  slice.tp->all_reduce_(sums, /*max=*/false);
  const Tensor loss = (sums[0].log() - sums[1]).masked_fill_(ignored, 0).sum();
  if (!grad) return loss;
  Tensor g = z.div_(sums[0].unsqueeze(1)).masked_fill_(ignored.unsqueeze(1), 0);
  g.scatter_add_(1, target, here.to(torch::kFloat).neg_().unsqueeze(1));
  logits = g.to(dtype);
  return loss;
}

// One chunk: h [n, C], w [V, C], y [n]. Returns the chunk's summed loss (float32 scalar) and
// fills `grads` with the gradients of that sum.
Tensor chunk_loss(const Tensor& h, const Tensor& w, const Tensor& y, int64_t ignore_index,
                  ChunkGrads grads, const VocabSlice& slice) {
  const bool grad = grads.hidden.defined() || grads.weight.defined();
  Tensor logits = torch::mm(h, w.t());  // [n, V]
  const Tensor loss = slice.tp ? sliced_logits_loss(logits, y, ignore_index, grad, slice)
                               : logits_loss(logits, y, ignore_index, grad);
  if (!grad) return loss;
  const Tensor& g = logits;  // d(sum)/d(logits), in h's dtype
  if (grads.hidden.defined()) grads.hidden.copy_(torch::mm(g, w));
  if (grads.weight.defined()) accumulate_weight_grad(grads.weight, g, h);
  return loss;
}

// The loss sum over all chunks of h [N, C] / y [N]; gradients into `grads` (dh [N, C], dW [V, C]).
Tensor chunked_loss(const Tensor& h, const Tensor& w, const Tensor& y, int64_t ignore_index,
                    int64_t chunk_tokens, const ChunkGrads& grads, const VocabSlice& slice) {
  Tensor sum = torch::zeros({}, h.options().dtype(torch::kFloat));
  const int64_t N = h.size(0);
  for (int64_t start = 0; start < N; start += chunk_tokens) {
    const int64_t n = std::min(chunk_tokens, N - start);
    ChunkGrads chunk{grads.hidden.defined() ? grads.hidden.narrow(0, start, n) : Tensor(),
                     grads.weight};
    sum.add_(
        chunk_loss(h.narrow(0, start, n), w, y.narrow(0, start, n), ignore_index, chunk, slice));
  }
  return sum;
}

// Removes and returns a tensor stored by forward; a second backward finds it gone.
Tensor take_saved(AutogradContext* ctx, const std::string& key) {
  auto it = ctx->saved_data.find(key);
  if (it == ctx->saved_data.end()) {
    fail(ErrorKind::kInternal,
         "linear_cross_entropy_sum: backward ran twice (its gradients are consumed by the first)");
  }
  Tensor t = it->second.toTensor();
  ctx->saved_data.erase(it);
  return t;
}

struct LinearCrossEntropySum : torch::autograd::Function<LinearCrossEntropySum> {
  static Tensor forward(AutogradContext* ctx, const Tensor& hidden, const Tensor& weight,
                        const Tensor& labels, int64_t ignore_index, int64_t chunk_tokens,
                        VocabSlice slice) {
    const Tensor h = hidden.reshape({-1, weight.size(1)});
    const auto fp32 = h.options().dtype(torch::kFloat);
    ChunkGrads grads;
    if (ctx->needs_input_grad(0)) grads.hidden = torch::empty(h.sizes(), fp32);
    if (ctx->needs_input_grad(1)) grads.weight = torch::zeros(weight.sizes(), fp32);
    const Tensor sum =
        chunked_loss(h, weight, labels.reshape({-1}), ignore_index, chunk_tokens, grads, slice);
    ctx->saved_data["dh"] = grads.hidden;
    ctx->saved_data["dw"] = grads.weight;
    ctx->saved_data["hidden_shape"] = hidden.sizes().vec();
    ctx->saved_data["hidden_dtype"] = static_cast<int64_t>(hidden.scalar_type());
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return sum;
  }

  // grad_outputs[0]: d(loss)/d(sum), a float32 scalar (1/N · loss scale / accumulation steps).
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const Tensor& scale = grad_outputs[0];
    Tensor dh = take_saved(ctx, "dh");
    Tensor dw = take_saved(ctx, "dw");
    const auto hidden_dtype = static_cast<c10::ScalarType>(ctx->saved_data["hidden_dtype"].toInt());
    const auto weight_dtype = static_cast<c10::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const std::vector<int64_t> shape = ctx->saved_data["hidden_shape"].toIntVector();
    if (dh.defined()) dh = dh.mul_(scale).to(hidden_dtype).view(shape);
    if (dw.defined()) dw = dw.mul_(scale).to(weight_dtype);
    return {dh, dw, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

void check_shapes(const Tensor& hidden, const Tensor& weight, const Tensor& labels) {
  const bool ok = weight.dim() == 2 && hidden.dim() >= 1 && hidden.size(-1) == weight.size(1) &&
                  labels.scalar_type() == torch::kLong &&
                  labels.numel() * weight.size(1) == hidden.numel() &&
                  hidden.scalar_type() == weight.scalar_type();
  if (!ok) {
    fail(ErrorKind::kInternal,
         "linear_cross_entropy_sum: hidden {} {}, weight {} {}, labels {} {} do not fit "
         "(expected hidden [..., C], weight [V, C] of one dtype, int64 labels [...])",
         c10::str(hidden.sizes()), c10::toString(hidden.scalar_type()), c10::str(weight.sizes()),
         c10::toString(weight.scalar_type()), c10::str(labels.sizes()),
         c10::toString(labels.scalar_type()));
  }
}

}  // namespace

int64_t loss_chunk_bytes(const torch::Device& device) {
  return device.is_cuda() ? kCudaLossChunkBytes : kDefaultLossChunkBytes;
}

int64_t loss_chunk_tokens(int64_t vocab, int64_t chunk_bytes) {
  const int64_t row_bytes = std::max<int64_t>(1, vocab) * static_cast<int64_t>(sizeof(float));
  return std::max<int64_t>(1, chunk_bytes / row_bytes);
}

Tensor linear_cross_entropy_sum(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                                int64_t ignore_index, int64_t chunk_bytes,
                                const VocabSlice& slice) {
  check_shapes(hidden, weight, labels);
  const int64_t chunk_tokens = loss_chunk_tokens(
      weight.size(0), chunk_bytes > 0 ? chunk_bytes : loss_chunk_bytes(hidden.device()));
  const bool wants_grad =
      torch::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  if (wants_grad) {
    return LinearCrossEntropySum::apply(hidden, weight, labels, ignore_index, chunk_tokens, slice);
  }
  torch::NoGradGuard no_grad;
  return chunked_loss(hidden.reshape({-1, weight.size(1)}), weight, labels.reshape({-1}),
                      ignore_index, chunk_tokens, ChunkGrads{}, slice);
}

}  // namespace dstrain::model
