#include "model/sliding_window_attention.h"

#include <gtest/gtest.h>

#include "counting_allocator.h"

namespace dstrain::model {
namespace {

struct Qkv {
  torch::Tensor q, k, v;  // [B, H, T, D], leaves that require grad
};

Qkv random_qkv(int64_t T, torch::ScalarType dtype, uint64_t seed) {
  torch::manual_seed(seed);
  auto make = [&] { return torch::randn({2, 3, T, 8}, dtype).requires_grad_(); };
  Qkv x;
  x.q = make();
  x.k = make();
  x.v = make();
  return x;
}

// The definition: SDPA with the dense [T, T] mask query - window < key <= query.
torch::Tensor dense_reference(const Qkv& x, int64_t window) {
  const int64_t T = x.q.size(2);
  const torch::Tensor i = torch::arange(T).unsqueeze(1), j = torch::arange(T).unsqueeze(0);
  const torch::Tensor mask = j.le(i) & j.gt(i - window);
  return at::scaled_dot_product_attention(x.q, x.k, x.v, mask);
}

std::vector<torch::Tensor> grads_of(const torch::Tensor& out, const Qkv& x,
                                    const torch::Tensor& weight) {
  return torch::autograd::grad({(out * weight).sum()}, {x.q, x.k, x.v});
}

// (T, window, query tile): tiles that divide T and that do not, a tile larger and smaller than the
// window, window 1 (each query sees only itself), a window one short of T.
struct Case {
  int64_t T, window, tile;
};

class SlidingWindow : public ::testing::TestWithParam<Case> {};

TEST_P(SlidingWindow, OutputAndGradientsEqualDenseBandMask) {
  const Case c = GetParam();
  const Qkv x = random_qkv(c.T, torch::kDouble, 1);
  const torch::Tensor weight = torch::randn({2, 3, c.T, 8}, torch::kDouble);
  const torch::Tensor want = dense_reference(x, c.window);
  const torch::Tensor got = sliding_window_attention(x.q, x.k, x.v, c.window, c.tile);
  EXPECT_TRUE(torch::allclose(got, want, 1e-12, 1e-12)) << (got - want).abs().max();
  const auto gw = grads_of(want, x, weight), gg = grads_of(got, x, weight);
  for (size_t n = 0; n < 3; ++n)
    EXPECT_TRUE(torch::allclose(gg[n], gw[n], 1e-12, 1e-12)) << "q k v"[2 * n];
}

INSTANTIATE_TEST_SUITE_P(Model, SlidingWindow,
                         ::testing::Values(Case{48, 12, 0}, Case{50, 12, 5}, Case{50, 12, 12},
                                           Case{50, 12, 31}, Case{20, 1, 0}, Case{20, 1, 3},
                                           Case{21, 20, 4}, Case{64, 16, 64}),
                         [](const auto& info) {
                           return "T" + std::to_string(info.param.T) + "Window" +
                                  std::to_string(info.param.window) + "Tile" +
                                  std::to_string(info.param.tile);
                         });

TEST(SlidingWindowAttention, WindowCoveringTheSequenceIsPlainCausal) {
  const Qkv x = random_qkv(16, torch::kFloat, 2);
  const torch::Tensor causal = at::scaled_dot_product_attention(x.q, x.k, x.v, {}, 0.0, true);
  EXPECT_TRUE(torch::equal(sliding_window_attention(x.q, x.k, x.v, 16), causal));
  EXPECT_FALSE(torch::allclose(sliding_window_attention(x.q, x.k, x.v, 15), causal));
}

TEST(SlidingWindowAttention, NoGradForwardEqualsTheDifferentiableOne) {
  const Qkv x = random_qkv(40, torch::kFloat, 3);
  const torch::Tensor with_graph = sliding_window_attention(x.q, x.k, x.v, 8, 6);
  ASSERT_TRUE(with_graph.requires_grad());
  torch::NoGradGuard no_grad;
  const torch::Tensor plain = sliding_window_attention(x.q, x.k, x.v, 8, 6);
  EXPECT_FALSE(plain.requires_grad());
  EXPECT_TRUE(torch::equal(plain, with_graph));
}

TEST(SlidingWindowAttention, OnlyTheInputsThatNeedGradientsGetThem) {
  Qkv x = random_qkv(30, torch::kFloat, 4);
  x.q = x.q.detach();
  x.v = x.v.detach();
  const torch::Tensor out = sliding_window_attention(x.q, x.k, x.v, 7, 4);
  out.sum().backward();
  EXPECT_FALSE(x.q.grad().defined());
  EXPECT_FALSE(x.v.grad().defined());
  ASSERT_TRUE(x.k.grad().defined());
  const Qkv ref{x.q, x.k.detach().requires_grad_(), x.v};
  dense_reference(ref, 7).sum().backward();
  EXPECT_TRUE(torch::allclose(x.k.grad(), ref.k.grad(), 1e-5, 1e-6));
}

TEST(SlidingWindowAttention, Bfloat16StaysCloseToFloat32) {
  const Qkv x = random_qkv(64, torch::kFloat, 5);
  const Qkv b{x.q.detach().to(torch::kBFloat16).requires_grad_(),
              x.k.detach().to(torch::kBFloat16).requires_grad_(),
              x.v.detach().to(torch::kBFloat16).requires_grad_()};
  const torch::Tensor want = sliding_window_attention(x.q, x.k, x.v, 16, 8);
  const torch::Tensor got = sliding_window_attention(b.q, b.k, b.v, 16, 8);
  EXPECT_EQ(got.scalar_type(), torch::kBFloat16);
  EXPECT_LT((got.to(torch::kFloat) - want).abs().max().item<float>(), 0.05);
  want.sum().backward();
  got.sum().backward();
  EXPECT_EQ(b.k.grad().scalar_type(), torch::kBFloat16);
  const torch::Tensor dk = b.k.grad().to(torch::kFloat);
  EXPECT_LT((dk - x.k.grad()).abs().max().item<float>(),
            0.05 * x.k.grad().abs().max().item<float>());
}

// The point of tiling: forward + backward at T = 2048 with a 64-token window never holds anything
// of [T, T] size. One [T, T] float32 matrix is 16 MiB; q, k, v, the output and their gradients
// are 256 KiB each.
TEST(SlidingWindowAttention, PeakMemoryStaysFarBelowOneTByTMatrix) {
  const int64_t T = 2048;
  torch::manual_seed(7);
  const torch::Tensor q = torch::randn({1, 2, T, 16}).requires_grad_();
  const torch::Tensor k = torch::randn({1, 2, T, 16}).requires_grad_();
  const torch::Tensor v = torch::randn({1, 2, T, 16}).requires_grad_();
  testing::CountingScope scope;
  scope.counter().reset_peak();
  const int64_t before = scope.counter().current();
  sliding_window_attention(q, k, v, 64).sum().backward();
  const int64_t peak = scope.counter().peak() - before;
  EXPECT_LT(peak, T * T * 4 / 4) << peak;
  EXPECT_TRUE(k.grad().defined());
}

TEST(SlidingWindowAttention, SecondBackwardIsAnError) {
  const Qkv x = random_qkv(20, torch::kFloat, 6);
  const torch::Tensor loss = sliding_window_attention(x.q, x.k, x.v, 4, 4).sum();
  loss.backward({}, /*retain_graph=*/true);
  EXPECT_ANY_THROW(loss.backward());
}

}  // namespace
}  // namespace dstrain::model
