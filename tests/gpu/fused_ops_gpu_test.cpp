// The fused kernels on a GPU (kernels/fused_ops.h through model/fused_layer_ops.h, with autograd)
// against PyTorch's eager formulas on the CPU: RoPE, SwiGLU, RMSNorm (alone and with the residual
// add before it), the residual add in the down projection's matmul and the chunked loss, forward
// and backward, float32 (tight) and bfloat16 (within a rounding of the float32 answer), and both
// variants of the cross-entropy kernel (vocabulary a multiple of 8 or not). Exits 77 (skipped)
// without a device.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/fused_layer_ops.h"
#include "model/fused_linear_cross_entropy.h"
#include "model/rope.h"

namespace dstrain::model {
namespace {

using torch::Tensor;

const torch::Device kCuda(torch::kCUDA, 0);

// |got - want| within tol of want's largest magnitude (at least 1).
void expect_close(const Tensor& got, const Tensor& want, double tol, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const Tensor g = got.detach().cpu().to(torch::kFloat), w = want.detach().cpu().to(torch::kFloat);
  const double scale = std::max(1.0, w.abs().max().item<double>());
  EXPECT_LE((g - w).abs().max().item<double>(), tol * scale) << what;
}

// Tolerance for a bf16 result against the float32 answer on bf16-rounded inputs: one rounding of
// the result (2^-8 relative) plus the inputs' own roundings through the op.
double tol_for(torch::Dtype dtype) {
  return dtype == torch::kBFloat16 ? 1.0 / 64 : 1e-5;
}

class FusedOpsGpu : public ::testing::TestWithParam<torch::Dtype> {};

// extra: columns of the projection output beyond q (16: rows aligned for the widest loads; 1:
// rows misaligned, the element-by-element kernel).
void check_rotary(torch::Dtype dtype, int64_t extra) {
  torch::manual_seed(1);
  const int64_t B = 2, T = 33, H = 3, D = 64;
  const Tensor inv_freq = 1.0 / torch::pow(1e6, torch::arange(0, D, 2).to(torch::kFloat) / D);
  auto [cos, sin] = rope_tables(inv_freq, T, 1.0);
  cos = cos.to(dtype);
  sin = sin.to(dtype);
  // A [B, T, H, D] view of a wider projection output, as q is when k and v share its buffer.
  const Tensor wide = torch::randn({B, T, H * D + extra}).to(dtype);
  const Tensor x = wide.narrow(2, 0, H * D).view({B, T, H, D});
  const Tensor grad = torch::randn({B, T, H, D}).to(dtype);

  const Tensor xc = x.to(kCuda).requires_grad_(true);
  ASSERT_TRUE(use_fused_kernels(xc));
  const Tensor got = rotary(xc, cos.to(kCuda), sin.to(kCuda));
  got.backward(grad.to(kCuda));

  const Tensor xf = x.to(torch::kFloat).requires_grad_(true);
  const Tensor want =
      apply_rope(xf, cos.to(torch::kFloat).unsqueeze(1), sin.to(torch::kFloat).unsqueeze(1));
  want.backward(grad.to(torch::kFloat));
  EXPECT_TRUE(got.is_contiguous());
  const std::string what = "rotary, extra columns " + std::to_string(extra);
  expect_close(got, want, tol_for(dtype), what.c_str());
  expect_close(xc.grad(), xf.grad(), tol_for(dtype), (what + " grad").c_str());
}

TEST_P(FusedOpsGpu, RotaryForwardAndBackward) {
  for (const int64_t extra : {16, 2, 1}) check_rotary(GetParam(), extra);
}

// Sizes a multiple of 8 (16-byte loads) and not (element by element).
void check_swiglu(torch::Dtype dtype, std::vector<int64_t> shape) {
  torch::manual_seed(2);
  const Tensor gate = (torch::randn(shape) * 3).to(dtype);
  const Tensor up = torch::randn(shape).to(dtype);
  const Tensor grad = torch::randn(shape).to(dtype);

  const Tensor gc = gate.to(kCuda).requires_grad_(true), uc = up.to(kCuda).requires_grad_(true);
  ASSERT_TRUE(use_fused_kernels(gc));
  const Tensor got = swiglu(gc, uc);
  got.backward(grad.to(kCuda));

  const Tensor gf = gate.to(torch::kFloat).requires_grad_(true);
  const Tensor uf = up.to(torch::kFloat).requires_grad_(true);
  const Tensor want = torch::silu(gf) * uf;
  want.backward(grad.to(torch::kFloat));
  expect_close(got, want, tol_for(dtype), "swiglu");
  expect_close(gc.grad(), gf.grad(), tol_for(dtype), "swiglu grad gate");
  expect_close(uc.grad(), uf.grad(), tol_for(dtype), "swiglu grad up");
}

TEST_P(FusedOpsGpu, SwigluForwardAndBackward) {
  check_swiglu(GetParam(), {4, 77, 160});
  check_swiglu(GetParam(), {3, 7, 5});
}

TEST_P(FusedOpsGpu, RmsNormForwardAndBackward) {
  const auto dtype = GetParam();
  torch::manual_seed(3);
  const Tensor x = (torch::randn({3, 50, 96}) * 2).to(dtype);
  const Tensor w = (torch::rand({96}) + 0.5).to(dtype);
  const Tensor grad = torch::randn({3, 50, 96}).to(dtype);

  const Tensor xc = x.to(kCuda).requires_grad_(true), wc = w.to(kCuda).requires_grad_(true);
  const Tensor got = rms_norm(xc, wc, 1e-6);
  got.backward(grad.to(kCuda));

  const Tensor xf = x.to(torch::kFloat).requires_grad_(true);
  const Tensor wf = w.to(torch::kFloat).requires_grad_(true);
  const Tensor want = rms_norm(xf, wf, 1e-6);  // the CPU: transformers' formula
  want.backward(grad.to(torch::kFloat));
  expect_close(got, want, tol_for(dtype), "rms_norm");
  expect_close(xc.grad(), xf.grad(), tol_for(dtype), "rms_norm grad x");
  // The weight's gradient sums 150 rows: its bf16 error grows with them.
  expect_close(wc.grad(), wf.grad(), dtype == torch::kBFloat16 ? 0.05 : 1e-4, "rms_norm grad w");
}

// The residual add + RMSNorm: the sum bit for bit the eager add's, the norm and the gradients of
// both outputs (x and delta share one) against the CPU's eager add and RMSNorm; hidden a multiple
// of 8 or not (16-byte loads or element by element), more rows than the backward's blocks (each
// block then sums several rows' weight gradient), and a frozen weight (no weight gradient).
void check_add_rms_norm(torch::Dtype dtype, int64_t rows, int64_t hidden, bool train_weight) {
  torch::manual_seed(5);
  const Tensor x = (torch::randn({rows, hidden}) * 2).to(dtype).view({1, rows, hidden});
  const Tensor delta = torch::randn({1, rows, hidden}).to(dtype);
  const Tensor w = (torch::rand({hidden}) + 0.5).to(dtype);
  const Tensor grad_sum = torch::randn({1, rows, hidden}).to(dtype);
  const Tensor grad_out = torch::randn({1, rows, hidden}).to(dtype);

  const Tensor xc = x.to(kCuda).requires_grad_(true), dc = delta.to(kCuda).requires_grad_(true);
  const Tensor wc = w.to(kCuda).requires_grad_(train_weight);
  ASSERT_TRUE(use_fused_kernels(xc));
  const auto [sum, out] = add_rms_norm(xc, dc, wc, 1e-6);
  EXPECT_TRUE(torch::equal(sum, xc.detach() + dc.detach()));
  torch::autograd::backward({sum, out}, {grad_sum.to(kCuda), grad_out.to(kCuda)});

  const Tensor xf = x.to(torch::kFloat).requires_grad_(true);
  const Tensor df = delta.to(torch::kFloat).requires_grad_(true);
  const Tensor wf = w.to(torch::kFloat).requires_grad_(true);
  const Tensor want_sum = xf + df;
  const Tensor want = rms_norm(want_sum, wf, 1e-6);  // the CPU: transformers' formula
  torch::autograd::backward({want_sum, want},
                            {grad_sum.to(torch::kFloat), grad_out.to(torch::kFloat)});
  const std::string what = "add_rms_norm " + std::to_string(rows) + "x" + std::to_string(hidden);
  expect_close(out, want, tol_for(dtype), what.c_str());
  expect_close(xc.grad(), xf.grad(), tol_for(dtype), (what + " grad x").c_str());
  EXPECT_TRUE(torch::equal(xc.grad(), dc.grad())) << what;
  if (train_weight) {
    // The weight's gradient sums the rows: its bf16 error grows with them.
    expect_close(wc.grad(), wf.grad(), dtype == torch::kBFloat16 ? 0.05 : 1e-4,
                 (what + " grad w").c_str());
  } else {
    EXPECT_FALSE(wc.grad().defined()) << what;
  }
}

TEST_P(FusedOpsGpu, AddRmsNormForwardAndBackward) {
  check_add_rms_norm(GetParam(), 150, 96, true);
  check_add_rms_norm(GetParam(), 21, 20, true);
  check_add_rms_norm(GetParam(), 600, 64, true);
  check_add_rms_norm(GetParam(), 150, 96, false);
}

// residual + x·Wᵀ as one addmm: the output and the gradients of all three against the CPU's eager
// projection and add.
TEST_P(FusedOpsGpu, AddProjectionForwardAndBackward) {
  const auto dtype = GetParam();
  torch::manual_seed(6);
  const Tensor residual = torch::randn({2, 33, 48}).to(dtype);
  const Tensor x = torch::randn({2, 33, 80}).to(dtype);
  const Tensor w = (torch::randn({48, 80}) * 0.1).to(dtype);
  const Tensor grad = torch::randn({2, 33, 48}).to(dtype);

  const Tensor rc = residual.to(kCuda).requires_grad_(true), xc = x.to(kCuda).requires_grad_(true);
  const Tensor wc = w.to(kCuda).requires_grad_(true);
  const Tensor got = add_projection(rc, xc, wc);
  got.backward(grad.to(kCuda));

  const Tensor rf = residual.to(torch::kFloat).requires_grad_(true);
  const Tensor xf = x.to(torch::kFloat).requires_grad_(true);
  const Tensor wf = w.to(torch::kFloat).requires_grad_(true);
  const Tensor want = rf + torch::nn::functional::linear(xf, wf);
  want.backward(grad.to(torch::kFloat));
  expect_close(got, want, tol_for(dtype), "add_projection");
  expect_close(rc.grad(), rf.grad(), 0.0, "add_projection grad residual");
  expect_close(xc.grad(), xf.grad(), tol_for(dtype), "add_projection grad x");
  // The weight's gradient sums 66 rows.
  expect_close(wc.grad(), wf.grad(), dtype == torch::kBFloat16 ? 0.05 : 1e-4,
               "add_projection grad w");
}

// The chunked loss: sum over tokens and its gradients, one chunk and several.
void check_loss(torch::Dtype dtype, int64_t V, int64_t chunk_bytes) {
  torch::manual_seed(4);
  const int64_t N = 70, C = 48;
  const Tensor h = torch::randn({N, C}).to(dtype);
  const Tensor w = (torch::randn({V, C}) * 0.3).to(dtype);
  Tensor y = torch::randint(0, V, {N}, torch::kLong);
  y.index_put_({torch::arange(0, N, 7)}, -100);

  const Tensor hc = h.to(kCuda).requires_grad_(true), wc = w.to(kCuda).requires_grad_(true);
  const Tensor got = linear_cross_entropy_sum(hc, wc, y.to(kCuda), -100, chunk_bytes);
  got.backward();

  const Tensor hf = h.to(torch::kFloat).requires_grad_(true);
  const Tensor wf = w.to(torch::kFloat).requires_grad_(true);
  const Tensor want = torch::nn::functional::cross_entropy(
      torch::mm(hf, wf.t()), y,
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
  want.backward();
  const std::string what = "V " + std::to_string(V) + " chunk " + std::to_string(chunk_bytes);
  // The loss sums 60 tokens of float32 math on bf16 logits (rounded once, like transformers').
  expect_close(got, want, dtype == torch::kBFloat16 ? 0.02 : 1e-5, (what + " loss").c_str());
  expect_close(hc.grad(), hf.grad(), tol_for(dtype), (what + " dh").c_str());
  expect_close(wc.grad(), wf.grad(), dtype == torch::kBFloat16 ? 0.05 : 1e-4,
               (what + " dw").c_str());
}

TEST_P(FusedOpsGpu, ChunkedLossBothKernelVariants) {
  ASSERT_TRUE(use_fused_kernels(torch::zeros({1}, torch::TensorOptions(kCuda).dtype(GetParam()))));
  for (const int64_t V : {97, 256}) {
    for (const int64_t chunk : {int64_t{0}, 16 * V * 4}) check_loss(GetParam(), V, chunk);
  }
}

TEST(FusedOpsGpuLoss, BadLabelGivesANonFiniteLossNotAStrayRead) {
  const Tensor h = torch::randn({4, 16}, kCuda), w = torch::randn({32, 16}, kCuda);
  const Tensor y = torch::tensor({1, 2, 32, 3}, torch::kLong).to(kCuda);
  EXPECT_TRUE(std::isnan(linear_cross_entropy_sum(h, w, y, -100).item<float>()));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedOpsGpu, ::testing::Values(torch::kFloat, torch::kBFloat16),
                         [](const auto& info) {
                           return info.param == torch::kFloat ? std::string("Float32")
                                                              : std::string("BFloat16");
                         });

}  // namespace
}  // namespace dstrain::model
