#pragma once
// One forward + backward of a decoder layer's attention module on its own, for tests that compare
// two ways of computing it (fused_qkv_test, the LoRA tests): the output and every gradient.

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "model/fused_qkv.h"
#include "model/layers.h"
#include "model/rope.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model::testing {

// Gives `params` storage in one new flat buffer, back to back in this order (as a ZeRO engine's
// flat buffer holds them), keeping their values.
inline void place_back_to_back(const std::vector<torch::Tensor>& params) {
  torch::NoGradGuard no_grad;
  int64_t total = 0;
  for (const auto& p : params) total += p.numel();
  const torch::Tensor flat = torch::empty({total}, params.front().options());
  int64_t offset = 0;
  for (torch::Tensor p : params) {
    const torch::Tensor slot = flat.narrow(0, offset, p.numel()).view(p.sizes());
    slot.copy_(p);
    p.set_data(slot);
    offset += p.numel();
  }
}

// The attention output ("out") for x and the gradients of x ("x") and of every parameter after one
// backward of sum(out·dy), and of `extra` (tensors the module reads, such as adapters) under their
// names; `fused` forces the fused product on the CPU. Gradients are cleared.
inline std::map<std::string, torch::Tensor> attention_pass(
    const ModelConfig& c, AttentionImpl& attn, const torch::Tensor& x, const torch::Tensor& dy,
    bool fused, const std::vector<std::pair<std::string, torch::Tensor>>& extra = {}) {
  std::optional<FusedQkvEverywhere> force;
  if (fused) force.emplace();
  EXPECT_EQ(use_fused_qkv(x), fused);
  attn.train();
  const int64_t T = x.size(1);
  auto [cos, sin] = rope_tables(rope_inv_freq(c, T), T);
  const torch::Tensor xg = x.detach().requires_grad_();
  const torch::Tensor out = attn.forward(xg, cos.to(x.scalar_type()), sin.to(x.scalar_type()));
  (out * dy).sum().backward();
  std::map<std::string, torch::Tensor> got{{"out", out.detach()}, {"x", xg.grad()}};
  for (auto& p : attn.named_parameters()) {
    got[p.key()] = p.value().grad();
    p.value().mutable_grad() = torch::Tensor();
  }
  for (auto [name, t] : extra) {
    got[name] = t.grad();
    t.mutable_grad() = torch::Tensor();
  }
  return got;
}

inline void expect_close(const std::map<std::string, torch::Tensor>& want,
                         const std::map<std::string, torch::Tensor>& got, double tol) {
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, w] : want) {
    const torch::Tensor& g = got.at(name);
    ASSERT_TRUE(w.defined() && g.defined()) << name << ": no gradient";
    EXPECT_EQ(g.scalar_type(), w.scalar_type()) << name;
    EXPECT_LE(relative_difference(w, g), tol) << name;
  }
}

}  // namespace dstrain::model::testing
