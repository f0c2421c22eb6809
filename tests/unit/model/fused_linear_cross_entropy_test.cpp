#include "model/fused_linear_cross_entropy.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "counting_allocator.h"
#include "model/model.h"
#include "test_util.h"

namespace dstrain::model {
namespace {

// Loss and gradients of one forward/backward.
struct Result {
  double loss = 0;
  torch::Tensor hidden_grad;
  torch::Tensor weight_grad;
};

struct Problem {
  torch::Tensor hidden;  // [B, T, C]
  torch::Tensor weight;  // [V, C]
  torch::Tensor labels;  // [B, T], some -100
};

Problem make_problem(int64_t B, int64_t T, int64_t C, int64_t V, double ignored_fraction,
                     uint64_t seed) {
  torch::manual_seed(seed);
  Problem p;
  p.hidden = torch::randn({B, T, C});
  p.weight = torch::randn({V, C}) * 0.5;
  p.labels = torch::randint(0, V, {B, T}, torch::kLong);
  p.labels.masked_fill_(torch::rand({B, T}) < ignored_fraction, kIgnoreIndex);
  return p;
}

// Runs `loss_of(hidden, weight)` on fresh leaf copies in `dtype` and backpropagates it.
template <typename LossFn>
Result run(const Problem& p, torch::ScalarType dtype, LossFn loss_of) {
  const torch::Tensor h = p.hidden.to(dtype).clone().requires_grad_(true);
  const torch::Tensor w = p.weight.to(dtype).clone().requires_grad_(true);
  const torch::Tensor loss = loss_of(h, w);
  loss.backward();
  return {loss.item<double>(), h.grad().to(torch::kFloat), w.grad().to(torch::kFloat)};
}

Result unfused(const Problem& p, torch::ScalarType dtype = torch::kFloat) {
  return run(p, dtype, [&](const torch::Tensor& h, const torch::Tensor& w) {
    return causal_lm_loss(torch::nn::functional::linear(h, w), p.labels);
  });
}

Result fused(const Problem& p, int64_t chunk_bytes, torch::ScalarType dtype = torch::kFloat) {
  return run(p, dtype, [&](const torch::Tensor& h, const torch::Tensor& w) {
    const LossSum s{linear_cross_entropy_sum(h, w, p.labels, kIgnoreIndex, chunk_bytes),
                    p.labels.ne(kIgnoreIndex).sum()};
    return s.mean();
  });
}

// Largest element difference relative to the largest element of `want`.
double max_relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  const double scale = want.abs().max().item<double>();
  return (got - want).abs().max().item<double>() / std::max(scale, 1e-30);
}

// Norm of the difference relative to the norm of `want`.
double relative_error(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).norm().item<double>() / std::max(want.norm().item<double>(), 1e-30);
}

void expect_matches_fp32(const Result& got, const Result& want) {
  EXPECT_NEAR(got.loss, want.loss, 1e-6 * std::abs(want.loss));
  EXPECT_LE(max_relative_error(got.hidden_grad, want.hidden_grad), 1e-6);
  EXPECT_LE(max_relative_error(got.weight_grad, want.weight_grad), 1e-6);
}

// Bytes of `tokens` rows of float32 logits of a vocabulary of `vocab`.
int64_t logit_bytes(int64_t tokens, int64_t vocab) {
  return tokens * vocab * 4;
}

TEST(FusedLinearCrossEntropy, ChunkTokensFollowTheByteBudget) {
  EXPECT_EQ(loss_chunk_tokens(151936, kDefaultLossChunkBytes), 441);
  EXPECT_EQ(loss_chunk_bytes(torch::Device(torch::kCPU)), kDefaultLossChunkBytes);
  EXPECT_EQ(loss_chunk_bytes(torch::Device(torch::kCUDA, 0)), kCudaLossChunkBytes);
  EXPECT_EQ(loss_chunk_tokens(151936, kCudaLossChunkBytes), 1766);
  EXPECT_EQ(loss_chunk_tokens(100, logit_bytes(7, 100)), 7);
  EXPECT_EQ(loss_chunk_tokens(100, 1), 1);  // never zero rows
}

TEST(FusedLinearCrossEntropy, MatchesUnfusedFp32WithIgnoredTokensAndUnevenChunks) {
  const Problem p = make_problem(2, 37, 16, 50, 0.2, 1);  // 74 tokens
  const Result want = unfused(p);
  for (int64_t tokens : {1, 7, 16, 74, 1000}) {
    SCOPED_TRACE("chunk tokens " + std::to_string(tokens));
    expect_matches_fp32(fused(p, logit_bytes(tokens, 50)), want);
  }
}

TEST(FusedLinearCrossEntropy, AllIgnoredGivesZeroLossAndZeroGradients) {
  Problem p = make_problem(2, 5, 8, 11, 0.0, 2);
  p.labels.fill_(kIgnoreIndex);
  const Result want = unfused(p);
  const Result got = fused(p, logit_bytes(3, 11));
  EXPECT_EQ(want.loss, 0.0);
  EXPECT_EQ(got.loss, 0.0);
  EXPECT_TRUE(torch::equal(got.hidden_grad, torch::zeros_like(got.hidden_grad)));
  EXPECT_TRUE(torch::equal(got.weight_grad, torch::zeros_like(got.weight_grad)));
}

// bf16 has no exact answer: the fused error against the fp32 result must be no worse than the
// unfused bf16 path's own error (the fused path rounds its gradients once, from float32 sums).
TEST(FusedLinearCrossEntropy, Bf16AsAccurateAsUnfusedBf16) {
  const Problem p = make_problem(2, 40, 32, 300, 0.1, 3);
  const Result exact = unfused(p);
  const Result theirs = unfused(p, torch::kBFloat16);
  const Result ours = fused(p, logit_bytes(16, 300), torch::kBFloat16);
  EXPECT_LE(std::abs(ours.loss - exact.loss),
            2 * std::abs(theirs.loss - exact.loss) + 1e-3 * exact.loss);
  EXPECT_LE(relative_error(ours.hidden_grad, exact.hidden_grad),
            2 * relative_error(theirs.hidden_grad, exact.hidden_grad) + 1e-3);
  EXPECT_LE(relative_error(ours.weight_grad, exact.weight_grad),
            2 * relative_error(theirs.weight_grad, exact.weight_grad) + 1e-3);
  EXPECT_LT(relative_error(ours.weight_grad, exact.weight_grad), 2e-2);
}

TEST(FusedLinearCrossEntropy, FrozenWeightGetsNoGradientAndHiddenStillDoes) {
  const Problem p = make_problem(1, 9, 8, 13, 0.2, 4);
  const Result want = unfused(p);
  const torch::Tensor h = p.hidden.clone().requires_grad_(true);
  const torch::Tensor sum = linear_cross_entropy_sum(h, p.weight, p.labels, kIgnoreIndex, 64);
  (sum / p.labels.ne(kIgnoreIndex).sum().to(torch::kFloat)).backward();
  EXPECT_FALSE(p.weight.grad().defined());
  EXPECT_LE(max_relative_error(h.grad(), want.hidden_grad), 1e-6);
}

TEST(FusedLinearCrossEntropy, WithoutGradModeComputesTheSameLossAndNoGraph) {
  const Problem p = make_problem(2, 6, 8, 13, 0.3, 5);
  const Result want = unfused(p);
  torch::NoGradGuard no_grad;
  const torch::Tensor w = p.weight.clone().requires_grad_(true);
  const torch::Tensor sum = linear_cross_entropy_sum(p.hidden, w, p.labels, kIgnoreIndex, 64);
  EXPECT_FALSE(sum.requires_grad());
  const double count = p.labels.ne(kIgnoreIndex).sum().item<double>();
  EXPECT_NEAR(sum.item<double>() / count, want.loss, 1e-6 * want.loss);
}

// The point of fusing: the peak of forward+backward stays near one chunk of logits plus the
// weight gradient instead of several copies of the whole [tokens, vocab] logits.
TEST(FusedLinearCrossEntropy, PeakMemoryStaysFarBelowTheWholeLogits) {
  const Problem p = make_problem(1, 512, 32, 4096, 0.0, 6);
  const int64_t logits = logit_bytes(512, 4096);  // 8 MiB
  auto peak_of = [](auto&& fn) {
    testing::CountingScope scope;
    scope.counter().reset_peak();
    const int64_t before = scope.counter().current();
    fn();
    return scope.counter().peak() - before;
  };
  const int64_t unfused_peak = peak_of([&] { unfused(p); });
  const int64_t fused_peak = peak_of([&] { fused(p, logit_bytes(32, 4096)); });
  EXPECT_GT(unfused_peak, 2 * logits);
  EXPECT_LT(fused_peak, logits / 2);
}

// Through the model: tied and untied heads, the tied embedding's gradient summing both uses.
class HeadLossSum : public ::testing::TestWithParam<bool> {};

TEST_P(HeadLossSum, MatchesUnfusedLossAndEveryParameterGradient) {
  nlohmann::json j = testing::small_config_json();
  j["tie_word_embeddings"] = GetParam();
  const ModelConfig config = parse_model_config(j);
  torch::manual_seed(7);
  const torch::Tensor ids = torch::randint(0, config.vocab_size, {2, 13}, torch::kLong);
  torch::Tensor labels = ids.roll(-1, 1);
  labels.select(1, 12).fill_(kIgnoreIndex);
  DecoderModel a = build_model(config, torch::kFloat, 3);
  DecoderModel b = build_model(config, torch::kFloat, 3);
  const torch::Tensor want = causal_lm_loss(a->forward(ids), labels);
  want.backward();
  const torch::Tensor got =
      b->head_loss_sum(b->hidden_states(ids), labels, logit_bytes(5, config.vocab_size)).mean();
  got.backward();
  EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-6 * want.item<double>());
  const auto want_params = a->named_parameters();
  for (const auto& item : b->named_parameters()) {
    SCOPED_TRACE(item.key());
    EXPECT_LE(max_relative_error(item.value().grad(), want_params[item.key()].grad()), 1e-5);
  }
  EXPECT_LE(max_relative_error(b->head_weight().grad(), a->head_weight().grad()), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Model, HeadLossSum, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Tied" : "Untied"; });

}  // namespace
}  // namespace dstrain::model
