// Packed documents (model/document_attention.h): attention within each document equals SDPA with
// the dense block-diagonal causal mask (and window), gradients included; a model run on rows of
// packed documents gives each document's logits and, summed, its loss gradients as if it ran
// alone; documents read from position ids as transformers reads a packed batch.
#include "model/document_attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <vector>

#include "model/model.h"
#include "tests/unit/model/test_util.h"

namespace dstrain::model {
namespace {

// Two rows of 24 tokens: 5 + 11 + 8, and 24 (one document).
Documents two_rows() {
  return Documents{{{5, 11, 8}, {24}}};
}

// The definition: a token sees the earlier tokens of its own document (the `window` latest).
torch::Tensor dense_reference(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, const Documents& d,
                              std::optional<int64_t> window) {
  const int64_t B = q.size(0), T = q.size(2), groups = q.size(1) / k.size(1);
  torch::Tensor doc = torch::empty({B, T}, torch::kLong);
  for (int64_t b = 0; b < B; ++b) {
    int64_t t = 0, id = 0;
    for (const int64_t n : d.lengths[static_cast<size_t>(b)]) {
      for (int64_t i = 0; i < n; ++i) doc[b][t++] = id;
      ++id;
    }
  }
  const torch::Tensor i = torch::arange(T).view({1, T, 1}), j = torch::arange(T).view({1, 1, T});
  torch::Tensor mask = j.le(i) & doc.unsqueeze(2).eq(doc.unsqueeze(1));
  if (window) mask = mask & j.gt(i - *window);
  return at::scaled_dot_product_attention(q, k.repeat_interleave(groups, 1),
                                          v.repeat_interleave(groups, 1), mask.unsqueeze(1));
}

TEST(DocumentAttention, EqualsTheDenseBlockDiagonalMaskWithGradients) {
  for (const std::optional<int64_t> window :
       {std::optional<int64_t>{}, std::optional<int64_t>{6}}) {
    torch::manual_seed(1);
    const auto leaf = [](int64_t heads) {
      return torch::randn({2, heads, 24, 8}, torch::kDouble).requires_grad_();
    };
    const torch::Tensor q = leaf(4), k = leaf(2), v = leaf(2);
    const torch::Tensor weight = torch::randn({2, 4, 24, 8}, torch::kDouble);
    const Documents d = two_rows();
    const torch::Tensor want = dense_reference(q, k, v, d, window);
    const torch::Tensor got = document_attention(q, k, v, d, window);
    EXPECT_TRUE(torch::allclose(got, want, 1e-10, 1e-10)) << (window ? *window : 0);
    const auto want_g = torch::autograd::grad({(want * weight).sum()}, {q, k, v});
    const auto got_g = torch::autograd::grad({(got * weight).sum()}, {q, k, v});
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(torch::allclose(got_g[i], want_g[i], 1e-10, 1e-10)) << i;
    }
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::allclose(document_attention(q, k, v, d, window), want, 1e-10, 1e-10));
  }
}

TEST(DocumentAttention, PositionsRestartInEveryDocumentAndComeFromPositionIds) {
  const Documents d = two_rows();
  const torch::Tensor p = d.positions(24);
  EXPECT_EQ(p[0][4].item<int64_t>(), 4);
  EXPECT_EQ(p[0][5].item<int64_t>(), 0);
  EXPECT_EQ(p[0][23].item<int64_t>(), 7);
  EXPECT_EQ(p[1][23].item<int64_t>(), 23);
  EXPECT_EQ(d.longest(), 24);
  const std::optional<Documents> back = Documents::from_position_ids(p);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->lengths, d.lengths);
  EXPECT_FALSE(Documents::from_position_ids(p + 1)) << "a row must start at position 0";
  torch::Tensor gap = p.clone();
  gap[0][7] = 5;
  EXPECT_FALSE(Documents::from_position_ids(gap)) << "positions count up by 1 in a document";
  EXPECT_THROW(Documents({{{5, 11, 7}, {24}}}).check(2, 24), Error);
  EXPECT_THROW(d.check(3, 24), Error);
}

// A row of packed documents is each document run alone: logits equal, and the summed losses'
// gradients equal the sum of each document's own (labels -100 at each document's last token, so
// that no label crosses into the next one). Every family the model supports: Qwen2's biases,
// Qwen3's q/k norms, a Mistral-style window smaller than a document.
TEST(DocumentAttention, APackedRowIsEachDocumentAlone) {
  for (const std::string family : {"llama", "qwen2", "qwen3", "mistral"}) {
    nlohmann::json j = testing::small_config_json(family);
    if (family == "mistral") j["sliding_window"] = 4;
    if (family == "qwen3") j["head_dim"] = 16;
    const ModelConfig config = parse_model_config(j);
    torch::manual_seed(2);
    DecoderModel m(config);
    m->to(torch::kDouble);
    const std::vector<int64_t> lengths = {5, 11, 8};
    const torch::Tensor ids = torch::randint(0, config.vocab_size, {1, 24}, torch::kLong);
    torch::Tensor labels = ids.roll(-1, 1);
    int64_t end = 0;
    for (const int64_t n : lengths) labels[0][(end += n) - 1] = -100;
    Positions packed;
    packed.documents = std::make_shared<const Documents>(Documents{{lengths}});
    const torch::Tensor logits = m->forward(ids, packed);
    m->zero_grad();
    m->loss_sum(ids, labels, /*fused=*/true, packed).sum.backward();
    std::vector<torch::Tensor> packed_grads;
    for (const auto& p : m->parameters()) packed_grads.push_back(p.grad().clone());
    m->zero_grad();
    int64_t begin = 0;
    for (const int64_t n : lengths) {
      const torch::Tensor doc = ids.narrow(1, begin, n);
      const torch::Tensor alone = m->forward(doc);
      EXPECT_TRUE(torch::allclose(logits.narrow(1, begin, n), alone, 1e-9, 1e-9))
          << family << " document at " << begin;
      m->loss_sum(doc, labels.narrow(1, begin, n), true).sum.backward();
      begin += n;
    }
    const auto params = m->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      // The fused loss forms the head's weight gradient in float32 (fused_linear_cross_entropy.h):
      // within 1e-6 of the largest element.
      const torch::Tensor want = params[i].grad();
      EXPECT_LE((packed_grads[i] - want).abs().max().item<double>(),
                1e-6 * want.abs().max().item<double>())
          << family << " parameter " << i;
    }
  }
}

// Checkpointed layers over packed rows, plain and selective (whose attention over packed
// documents is recomputed, not kept: selective_attention.h), give the gradients of the run without
// checkpointing.
TEST(DocumentAttention, CheckpointedLayersGiveTheSameGradients) {
  const ModelConfig config = testing::small_config("llama");
  const torch::Tensor ids = torch::randint(0, config.vocab_size, {2, 24}, torch::kLong);
  Positions packed;
  packed.documents = std::make_shared<const Documents>(two_rows());
  const auto grads = [&](const BlockWrapper& wrapper) {
    torch::manual_seed(4);
    DecoderModel m(config);
    m->to(torch::kDouble);
    m->train();
    if (wrapper) m->wrap_blocks(WrapperSlot::kCheckpointing, wrapper);
    m->loss_sum(ids, ids.roll(-1, 1), /*fused=*/true, packed).sum.backward();
    std::vector<torch::Tensor> out;
    for (const auto& p : m->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const std::vector<torch::Tensor> plain = grads({});
  for (const BlockWrapper& w : {checkpoint_layers(), selective_checkpoint_layers()}) {
    const std::vector<torch::Tensor> got = grads(w);
    ASSERT_EQ(got.size(), plain.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[i], plain[i], 1e-12, 1e-12)) << "parameter " << i;
    }
  }
}

}  // namespace
}  // namespace dstrain::model
