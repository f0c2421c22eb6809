// The CPU references of the fused kernels against PyTorch's eager formulas (transformers' own):
// RoPE forward, and its inverse against autograd's gradient of forward; SwiGLU and its gradient;
// the cross-entropy's loss and gradient against log_softmax and autograd; the residual add +
// RMSNorm and its gradients (input, with and without the residual's; weight) against autograd, and
// the autograd function around those kernels. The CUDA kernels are held to these references on a
// GPU (tests/gpu/fused_ops_gpu_test.cpp), so the per-element math and the indexing are proved here
// on every machine.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/error.h"
#include "kernels/fused_ops.h"
#include "model/fused_layer_ops.h"
#include "model/rope.h"

namespace dstrain::kernels {
namespace {

using torch::Tensor;

void expect_close(const Tensor& got, const Tensor& want, double tol = 1e-6) {
  ASSERT_EQ(got.sizes(), want.sizes());
  const double scale = std::max(1.0, want.abs().max().item<double>());
  EXPECT_LE((got - want).abs().max().item<double>(), tol * scale);
}

// Tables as model::rope_tables makes them: [T, D], halves equal.
std::pair<Tensor, Tensor> tables(int64_t T, int64_t D) {
  const Tensor inv_freq = 1.0 / torch::pow(10000.0, torch::arange(0, D, 2).to(torch::kFloat) / D);
  return model::rope_tables(inv_freq, T, 1.0);
}

Tensor rope_ref(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse) {
  Tensor out = torch::empty(x.sizes(), x.options());
  rope_reference(model::rope_args(x, out, cos.contiguous(), sin.contiguous(), inverse));
  return out;
}

TEST(FusedOpsReference, RopeIsTransformersRotationAndItsInverseTheGradient) {
  torch::manual_seed(1);
  const int64_t B = 2, T = 5, H = 3, D = 8;
  auto [cos, sin] = tables(T, D);
  // x as the attention sees it: a [B, T, H, D] view of a wider projection output (strided rows).
  const Tensor wide = torch::randn({B, T, H * D + 4});
  const Tensor x = wide.narrow(2, 0, H * D).view({B, T, H, D}).requires_grad_(false);
  ASSERT_FALSE(x.is_contiguous());
  const Tensor xg = x.detach().clone().requires_grad_(true);
  const Tensor eager = model::apply_rope(xg, cos.unsqueeze(1), sin.unsqueeze(1));
  expect_close(rope_ref(x, cos, sin, false), eager.detach());

  const Tensor grad = torch::randn({B, T, H, D});
  eager.backward(grad);
  expect_close(rope_ref(grad, cos, sin, true), xg.grad());
}

// Packed documents: per-token tables [B, T, D] (each token at its position in its document) go
// through the kernel as one sequence of B·T tokens over the strided projection output; forward and
// gradient equal the eager rotation with those tables.
TEST(FusedOpsReference, RopeWithPerTokenTablesIsTheEagerRotation) {
  torch::manual_seed(3);
  const int64_t B = 2, T = 6, H = 3, D = 8;
  auto [cos_t, sin_t] = tables(T, D);
  // Row 0: documents of 4 and 2 tokens; row 1: one of 6.
  const Tensor positions = torch::tensor({0, 1, 2, 3, 0, 1, 0, 1, 2, 3, 4, 5}).view({B, T});
  const Tensor cos = cos_t.index({positions}), sin = sin_t.index({positions});
  const Tensor wide = torch::randn({B, T, H * D + 4});
  const Tensor x = wide.narrow(2, 0, H * D).view({B, T, H, D});
  ASSERT_FALSE(x.is_contiguous());
  ASSERT_EQ(x.stride(0), T * x.stride(1));
  const Tensor wide_f = wide.clone().requires_grad_(true);
  const Tensor xe = x.detach().clone().requires_grad_(true);
  const Tensor fused =
      model::rotary_kernels_per_token(wide_f.narrow(2, 0, H * D).view({B, T, H, D}), cos, sin);
  const Tensor eager = model::apply_rope(xe, cos.unsqueeze(2), sin.unsqueeze(2));
  expect_close(fused.detach(), eager.detach());
  const Tensor grad = torch::randn({B, T, H, D});
  fused.backward(grad);
  eager.backward(grad);
  expect_close(wide_f.grad().narrow(2, 0, H * D).view({B, T, H, D}), xe.grad());
  // Rows that do not follow each other in memory are not flattened.
  const Tensor gapped = torch::randn({B, T + 1, H, D}).narrow(1, 0, T);
  EXPECT_THROW(model::rotary_kernels_per_token(gapped, cos, sin), Error);
}

TEST(FusedOpsReference, RopeUsesBothHalvesOfTheTables) {
  // Tables whose halves differ (not what rope_tables makes) still follow the stated formula.
  torch::manual_seed(2);
  const Tensor x = torch::randn({1, 3, 2, 4}), cos = torch::randn({3, 4}),
               sin = torch::randn({3, 4});
  const Tensor rotated = torch::cat({-x.narrow(-1, 2, 2), x.narrow(-1, 0, 2)}, -1);
  expect_close(rope_ref(x, cos, sin, false), x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1));
}

TEST(FusedOpsReference, SwigluAndItsGradient) {
  torch::manual_seed(3);
  const Tensor gate = (torch::randn({257}) * 4).requires_grad_(true);
  const Tensor up = torch::randn({257}).requires_grad_(true);
  const Tensor eager = torch::silu(gate) * up;
  const Tensor grad = torch::randn({257});
  eager.backward(grad);

  Tensor out = torch::empty({257});
  swiglu_reference({gate.data_ptr(), up.data_ptr(), out.data_ptr(), 257, ElementType::kFloat32});
  expect_close(out, eager.detach());
  Tensor grad_gate = torch::empty({257}), grad_up = torch::empty({257});
  swiglu_backward_reference({grad.data_ptr(), gate.data_ptr(), up.data_ptr(), grad_gate.data_ptr(),
                             grad_up.data_ptr(), 257, ElementType::kFloat32});
  expect_close(grad_gate, gate.grad());
  expect_close(grad_up, up.grad());
}

TEST(FusedOpsReference, CrossEntropyLossAndGradientWithIgnoredAndBadLabels) {
  torch::manual_seed(4);
  const int64_t n = 6, V = 37;
  const Tensor logits = (torch::randn({n, V}) * 3).requires_grad_(true);
  const Tensor labels = torch::tensor({3, -100, 0, 36, 12, -100}, torch::kLong);
  const Tensor per_row = torch::nn::functional::cross_entropy(
      logits, labels,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kNone));
  per_row.sum().backward();

  Tensor work = logits.detach().clone();
  Tensor loss = torch::empty({n});
  CrossEntropyArgs a;
  a.logits = work.data_ptr();
  a.labels = labels.data_ptr<int64_t>();
  a.loss = loss.data_ptr<float>();
  a.rows = n;
  a.vocab = V;
  a.write_grad = true;
  cross_entropy_reference(a);
  expect_close(loss, per_row.detach());
  expect_close(work, logits.grad());

  // Without write_grad the logits stay; a label outside [0, V) gives NaN, not a stray read.
  const Tensor bad = torch::tensor({V}, torch::kLong);
  Tensor row = logits.detach()[0].clone().unsqueeze(0);
  const Tensor kept = row.clone();
  a.logits = row.data_ptr();
  a.labels = bad.data_ptr<int64_t>();
  a.rows = 1;
  a.write_grad = false;
  cross_entropy_reference(a);
  EXPECT_TRUE(std::isnan(loss[0].item<float>()));
  EXPECT_TRUE(torch::equal(row, kept));
}

TEST(FusedOpsReference, AddRmsNormAndItsGradients) {
  torch::manual_seed(5);
  const int64_t rows = 7, hidden = 24;
  const float eps = 1e-6f;
  const Tensor x = (torch::randn({rows, hidden}) * 2).requires_grad_(true);
  const Tensor delta = torch::randn({rows, hidden}).requires_grad_(true);
  const Tensor weight = (torch::rand({hidden}) + 0.5).requires_grad_(true);
  const Tensor grad_out = torch::randn({rows, hidden}), grad_sum = torch::randn({rows, hidden});
  // Eager, as the decoder layer computed it before: the add, then transformers' RMSNorm.
  const Tensor eager_sum = x + delta;
  const Tensor eager_out =
      weight * (eager_sum * torch::rsqrt(eager_sum.pow(2).mean(-1, true) + eps));
  torch::autograd::backward({eager_sum, eager_out}, {grad_sum, grad_out}, /*retain_graph=*/true);

  Tensor sum = torch::empty({rows, hidden}), out = torch::empty({rows, hidden});
  Tensor rstd = torch::empty({rows});
  AddRmsNormArgs f;
  f.x = x.data_ptr();
  f.delta = delta.data_ptr();
  f.weight = weight.data_ptr();
  f.sum = sum.data_ptr();
  f.out = out.data_ptr();
  f.rstd = rstd.data_ptr<float>();
  f.rows = rows;
  f.hidden = hidden;
  f.eps = eps;
  add_rms_norm_reference(f);
  EXPECT_TRUE(torch::equal(sum, eager_sum.detach()));  // the add rounds as the eager add does
  expect_close(out, eager_out.detach());
  expect_close(rstd, torch::rsqrt(eager_sum.detach().pow(2).mean(-1) + eps));

  Tensor grad_in = torch::empty({rows, hidden}), grad_weight = torch::empty({hidden});
  AddRmsNormBackwardArgs b;
  b.grad_out = grad_out.data_ptr();
  b.grad_sum = grad_sum.data_ptr();
  b.sum = sum.data_ptr();
  b.weight = weight.data_ptr();
  b.rstd = rstd.data_ptr<float>();
  b.grad_in = grad_in.data_ptr();
  b.grad_weight = grad_weight.data_ptr();
  b.rows = rows;
  b.hidden = hidden;
  add_rms_norm_backward_reference(b);
  // x and delta share the sum's gradient: the residual's plus the norm's.
  expect_close(grad_in, x.grad(), 1e-5);
  expect_close(grad_in, delta.grad(), 1e-5);
  expect_close(grad_weight, weight.grad(), 1e-5);

  // Without the residual's gradient (nor the weight's): the norm's alone.
  x.grad().zero_();
  eager_out.backward(grad_out);
  b.grad_sum = nullptr;
  b.grad_weight = nullptr;
  add_rms_norm_backward_reference(b);
  expect_close(grad_in, x.grad(), 1e-5);
}

// The autograd function around the add + RMSNorm kernels (model::add_rms_norm_kernels), run here
// on the references: its outputs and the gradients it hands to x, delta and the weight against
// the eager add and RMSNorm, with and without the sum used downstream (the residual's gradient
// undefined) and with a frozen weight (no weight gradient).
TEST(FusedOpsReference, AddRmsNormAutogradFunction) {
  torch::manual_seed(6);
  const Tensor x0 = torch::randn({2, 5, 16}) * 2, d0 = torch::randn({2, 5, 16});
  const Tensor w0 = torch::rand({16}) + 0.5;
  const Tensor grad_sum = torch::randn({2, 5, 16}), grad_out = torch::randn({2, 5, 16});
  const auto leaf = [](const Tensor& t, bool grad) { return t.clone().requires_grad_(grad); };
  for (const bool train_weight : {true, false}) {
    for (const bool use_sum : {true, false}) {
      const Tensor x = leaf(x0, true), d = leaf(d0, true), w = leaf(w0, train_weight);
      const auto [sum, out] = model::add_rms_norm_kernels(x, d, w, 1e-6);
      const Tensor xe = leaf(x0, true), de = leaf(d0, true), we = leaf(w0, train_weight);
      const Tensor sum_e = xe + de;
      const Tensor out_e = model::rms_norm(sum_e, we, 1e-6);
      EXPECT_TRUE(torch::equal(sum, sum_e));
      expect_close(out.detach(), out_e.detach());
      Tensor loss = (out * grad_out).sum(), loss_e = (out_e * grad_out).sum();
      if (use_sum) {
        loss = loss + (sum * grad_sum).sum();
        loss_e = loss_e + (sum_e * grad_sum).sum();
      }
      loss.backward();
      loss_e.backward();
      expect_close(x.grad(), xe.grad(), 1e-5);
      EXPECT_TRUE(torch::equal(x.grad(), d.grad()));
      if (train_weight) {
        expect_close(w.grad(), we.grad(), 1e-5);
      } else {
        EXPECT_FALSE(w.grad().defined());
      }
    }
  }
}

TEST(FusedOpsReference, ReferencesRefuseBFloat16) {
  SwigluArgs a;
  a.type = ElementType::kBFloat16;
  EXPECT_THROW(swiglu_reference(a), Error);
}

}  // namespace
}  // namespace dstrain::kernels
