// Each projection a block offers for adapters (Block::projections()) owns its adapter slot
// (LinearImpl::adapter), and the block's forward reads it: an adapter set on any offered
// projection is called by every forward, on every path the forward can take (q/k/v as one matrix
// product or three, the MLP tiled or not), for every family. A projection the forward computed
// without its slot would leave LoRA training nothing there without a word.
#include <map>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "model/fused_qkv.h"
#include "model/model.h"
#include "test_util.h"

namespace dstrain::model {
namespace {

// Adds nothing; counts its calls.
class CountingAdapter final : public LinearAdapter {
 public:
  explicit CountingAdapter(int64_t out) : out_(out) {}
  torch::Tensor delta(const torch::Tensor& x, bool) override {
    ++calls;
    std::vector<int64_t> shape = x.sizes().vec();
    shape.back() = out_;
    return torch::zeros(shape, x.options());
  }
  std::vector<torch::Tensor> parameters() const override { return {}; }
  int calls = 0;

 private:
  int64_t out_;
};

TEST(AdapterSlots, EveryProjectionABlockOffersIsReadByItsForwardOnEveryPath) {
  for (const char* type : {"llama", "qwen2", "qwen3", "mistral"}) {
    nlohmann::json doc = testing::small_config_json(type);
    if (std::string(type) == "qwen3") doc["head_dim"] = 16;
    DecoderModel m = build_model(parse_model_config(doc), torch::kFloat, 3);
    m->train();
    std::map<std::string, std::shared_ptr<CountingAdapter>> adapters;
    for (const auto& block : m->blocks()) {
      for (const Projection& p : block->block->projections()) {
        auto adapter = std::make_shared<CountingAdapter>(p.linear->out_features);
        p.linear.ptr()->adapter = adapter;
        adapters[block->name + "." + p.path] = adapter;
      }
    }
    ASSERT_EQ(adapters.size(), 2u * 7u) << type << ": 2 layers of q k v o gate up down";
    const torch::Tensor ids = torch::randint(0, 97, {2, 12});
    int forwards = 0;
    for (const char* path : {"plain", "fused q/k/v", "tiled MLP"}) {
      const std::string which = path;
      std::unique_ptr<FusedQkvEverywhere> fused;
      if (which == "fused q/k/v") fused = std::make_unique<FusedQkvEverywhere>();
      m->set_tiled_mlp(which == "tiled MLP" ? 4 : 0);
      (void)m->forward(ids);
      ++forwards;
      for (const auto& [name, adapter] : adapters) {
        EXPECT_GE(adapter->calls, forwards) << type << " " << path << ": " << name;
      }
    }
  }
}

}  // namespace
}  // namespace dstrain::model
