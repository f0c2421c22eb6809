#pragma once
// One forward + backward of a decoder model and what it gives (loss, every parameter's
// gradient), for tests that compare two ways of computing the same training step.

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/model.h"
#include "tests/unit/model/counting_allocator.h"

namespace dstrain::model::testing {

inline torch::Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(0, V, {B, T}, torch::kLong);
}

// The gradients of `m`'s parameters, in parameters() order; they are cleared.
inline std::vector<torch::Tensor> take_grads(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& p : m.parameters()) {
    out.push_back(p.grad().clone());
    p.mutable_grad() = torch::Tensor();
  }
  return out;
}

struct LossAndGrads {
  double loss = 0;
  std::vector<std::pair<std::string, torch::Tensor>> grads;  // undefined: no gradient
};

// One forward + backward of `m` in training mode; the gradients of its parameters and of `extra`
// (named extra0, extra1, ...) are taken and cleared.
inline LossAndGrads train_pass(DecoderModelImpl& m, const torch::Tensor& ids,
                               const std::vector<torch::Tensor>& extra = {}) {
  m.train();
  const torch::Tensor loss = causal_lm_loss(m.forward(ids), ids.roll(-1, 1));
  loss.backward();
  LossAndGrads out;
  out.loss = loss.item<double>();
  auto take = [&](const std::string& name, torch::Tensor p) {
    out.grads.emplace_back(name, p.grad().defined() ? p.grad().clone() : torch::Tensor());
    p.mutable_grad() = torch::Tensor();
  };
  for (auto& p : m.named_parameters()) take(p.key(), p.value());
  for (size_t i = 0; i < extra.size(); ++i) take("extra" + std::to_string(i), extra[i]);
  return out;
}

// Peak bytes the CPU allocator hands out above the starting point during one forward + backward,
// after a warm-up pass (lazily created buffers are not part of the comparison).
inline int64_t peak_training_bytes(DecoderModelImpl& m, const torch::Tensor& ids) {
  (void)train_pass(m, ids);
  CountingScope scope;
  CountingAllocator& c = scope.counter();
  const int64_t start = c.current();
  c.reset_peak();
  (void)train_pass(m, ids);
  return c.peak() - start;
}

// max |a - b| / max |a|, in float32.
inline double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor af = a.to(torch::kFloat), bf = b.to(torch::kFloat);
  const double scale = std::max(af.abs().max().item<double>(), 1e-30);
  return (af - bf).abs().max().item<double>() / scale;
}

// The same loss and every gradient within `tol` (relative), each gradient present in both.
inline void expect_same_training(const LossAndGrads& expected, const LossAndGrads& got,
                                 double tol) {
  EXPECT_NEAR(got.loss, expected.loss, tol * std::abs(expected.loss));
  ASSERT_EQ(expected.grads.size(), got.grads.size());
  for (size_t i = 0; i < expected.grads.size(); ++i) {
    const auto& [name, g] = expected.grads[i];
    ASSERT_TRUE(g.defined()) << name;
    ASSERT_TRUE(got.grads[i].second.defined()) << name << ": no gradient";
    EXPECT_LE(relative_difference(g, got.grads[i].second), tol) << name;
  }
}

}  // namespace dstrain::model::testing
