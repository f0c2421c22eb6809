// CUDA graphs per layer (model/layer_graphs.h) on a GPU: replayed training passes give the eager
// passes' loss and every gradient bit for bit (the same kernels, fused ones included), and every
// first-use check of a recording against the eager layer passes, with and without checkpointing, in
// float32 and bfloat16; dropout inside a layer draws the eager masks; a layer that synchronises
// with the host fails its recording, warns once, runs eagerly with the same results, and leaves the
// generator and the allocator usable (a later recording works). Exits 77 (skipped) without a
// device.
#include <optional>
#include <stdexcept>

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "model/activation_checkpoint.h"
#include "model/layer_graphs.h"
#include "model/model.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model {
namespace {

using testing::LossAndGrads;
using testing::train_pass;

const torch::Device kCuda(torch::kCUDA, 0);

DecoderModel cuda_model(const char* type, torch::ScalarType dtype) {
  const ModelConfig c = parse_model_config({{"model_type", type},
                                            {"vocab_size", 97},
                                            {"hidden_size", 256},
                                            {"intermediate_size", 512},
                                            {"num_hidden_layers", 3},
                                            {"num_attention_heads", 4},
                                            {"num_key_value_heads", 2},
                                            {"max_position_embeddings", 4096},
                                            {"rms_norm_eps", 1e-6},
                                            {"rope_theta", 10000.0},
                                            {"tie_word_embeddings", false}});
  DecoderModel m = build_model(c, dtype, 3);
  m->to(kCuda);
  return m;
}

torch::Tensor cuda_ids(uint64_t seed) {
  torch::manual_seed(seed);
  // 128 tokens: one key block of the flash kernels, whose backward is then deterministic (the
  // comparison is bit for bit, so eager must repeat itself; the test checks that it does).
  return torch::randint(0, 97, {1, 128}, torch::kLong).to(kCuda);
}

void expect_identical(const LossAndGrads& expected, const LossAndGrads& got, const char* what) {
  EXPECT_EQ(got.loss, expected.loss) << what;
  ASSERT_EQ(expected.grads.size(), got.grads.size());
  for (size_t i = 0; i < expected.grads.size(); ++i) {
    const auto& [name, e] = expected.grads[i];
    const torch::Tensor& g = got.grads[i].second;
    ASSERT_EQ(e.defined(), g.defined()) << what << " " << name;
    if (e.defined()) {
      EXPECT_TRUE(torch::equal(e, g)) << what << " " << name;
    }
  }
}

struct Case {
  const char* type;
  torch::ScalarType dtype;
  bool checkpointing;
  const char* name;
  bool training_stream;  // on a TrainingStream (as the trainer), else the default stream
};

TEST(LayerGraphsGpu, ReplayedPassesEqualEagerPassesBitForBit) {
  for (const Case& c :
       {Case{"llama", torch::kFloat, false, "llama fp32", true},
        Case{"llama", torch::kBFloat16, false, "llama bf16", true},
        Case{"llama", torch::kBFloat16, false, "llama bf16 on the default stream", false},
        Case{"qwen2", torch::kBFloat16, false, "qwen2 bf16", true},
        Case{"qwen2", torch::kBFloat16, true, "qwen2 bf16 checkpointing", true}}) {
    std::optional<TrainingStream> stream;
    if (c.training_stream) stream.emplace(kCuda);
    DecoderModel m = cuda_model(c.type, c.dtype);
    if (c.checkpointing) m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
    std::vector<LossAndGrads> eager;
    for (uint64_t k = 0; k < 3; ++k) eager.push_back(train_pass(*m, cuda_ids(k)));
    expect_identical(eager[0], train_pass(*m, cuda_ids(0)), "eager repeats itself");
    m->unwrap_blocks();
    LayerGraphs graphs(cuda_graph_recorder(kCuda), {c.checkpointing});
    m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
    if (c.checkpointing) m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
    for (uint64_t k = 0; k < 3; ++k)
      expect_identical(eager[k], train_pass(*m, cuda_ids(k)), c.name);
    torch::cuda::synchronize();
    const LayerGraphStats st = graphs.stats();
    EXPECT_EQ(st.failure, "") << c.name;
    EXPECT_EQ(st.recordings, c.checkpointing ? 9 : 6) << c.name;
    EXPECT_EQ(st.eager_calls, 0) << c.name;
    // The first-use checks passed on the card (each failure says where and by how much).
    for (const LayerFallback& f : graphs.take_fallbacks()) {
      ADD_FAILURE() << c.name << ": " << graphs.block_name(f.layer)
                    << " fell back: " << fallback_cause_text(f.cause) << " " << f.detail
                    << " error " << f.error << " bound " << f.bound;
    }
  }
}

// A layer of one matmul and dropout, or (sync) one that reads a value on the host first.
class SmallLayer final : public Block {
 public:
  explicit SmallLayer(bool sync)
      : w_(torch::randn({64, 64}, torch::TensorOptions().device(kCuda)).requires_grad_()),
        sync_(sync) {}
  torch::Tensor forward(const torch::Tensor& x, const BlockContext&) override {
    torch::Tensor y = torch::matmul(x, w_);
    if (sync_ && y.sum().item<float>() == 12345.f) y = y * 2;  // a host read: not capturable
    return torch::dropout(y, 0.25, /*train=*/true) + x;
  }
  std::vector<torch::Tensor> weights() override { return {w_}; }
  // No memory model reads this block: nothing described.
  ActivationMemory activation_memory(const ActivationRun&, Checkpointing) const override {
    return {};
  }
  torch::Tensor w_;

 private:
  bool sync_;
};

// Three steps through the layer (wrapped or not): outputs, input and weight gradients.
std::vector<torch::Tensor> small_steps(SmallLayer& layer, const BlockWrapper* wrapper) {
  ModelBlock mb;
  mb.name = "model.layers.0";
  mb.role = BlockRole::kLayer;
  mb.block = std::shared_ptr<Block>(&layer, [](Block*) {});
  BlockContext ctx;
  ctx.training = true;
  ctx.cos = torch::ones({16, 8}, kCuda);
  ctx.sin = torch::zeros({16, 8}, kCuda);
  torch::manual_seed(3);
  const torch::Tensor x0 = torch::randn({2, 16, 64}, kCuda);
  torch::cuda::manual_seed(11);
  std::vector<torch::Tensor> out;
  for (int i = 0; i < 3; ++i) {
    torch::Tensor x = x0.clone().requires_grad_();
    const BlockFn run = [&](const torch::Tensor& in) { return layer.forward(in, ctx); };
    const torch::Tensor y = wrapper ? (*wrapper)(mb, x, ctx, run) : run(x);
    y.pow(2).sum().backward();
    out.push_back(y.detach().clone());
    out.push_back(x.grad().clone());
    out.push_back(layer.w_.grad().clone());
    layer.w_.mutable_grad() = torch::Tensor();
  }
  torch::cuda::synchronize();
  return out;
}

TEST(LayerGraphsGpu, DropoutDrawsTheEagerMasks) {
  torch::manual_seed(1);
  SmallLayer layer(false);
  const auto eager = small_steps(layer, nullptr);
  LayerGraphs graphs(cuda_graph_recorder(kCuda), {});
  const BlockWrapper wrapper = graphs.wrapper();
  const auto replayed = small_steps(layer, &wrapper);
  ASSERT_EQ(eager.size(), replayed.size());
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(torch::equal(eager[i], replayed[i])) << i;
  EXPECT_FALSE(torch::equal(eager[0], eager[3]));  // the masks change from step to step
  EXPECT_EQ(graphs.stats().recordings, 2);
  EXPECT_EQ(graphs.stats().failure, "");
}

TEST(LayerGraphsGpu, AHostReadFailsTheRecordingAndTheLayerRunsEagerly) {
  torch::manual_seed(1);
  SmallLayer syncing(true);
  const auto eager = small_steps(syncing, nullptr);
  LayerGraphs graphs(cuda_graph_recorder(kCuda), {});
  const BlockWrapper wrapper = graphs.wrapper();
  ::testing::internal::CaptureStderr();
  const auto fallen_back = small_steps(syncing, &wrapper);
  const std::string err = ::testing::internal::GetCapturedStderr();
  for (size_t i = 0; i < eager.size(); ++i)
    EXPECT_TRUE(torch::equal(eager[i], fallen_back[i])) << i;
  EXPECT_NE(graphs.stats().failure, "");
  EXPECT_EQ(graphs.stats().eager_calls, 3);
  EXPECT_NE(err.find("recording model.layers.0 failed"), std::string::npos) << err;
  // The generator and the caching allocator left capture mode: another layer records and replays.
  torch::manual_seed(1);
  SmallLayer plain(false);
  const auto plain_eager = small_steps(plain, nullptr);
  LayerGraphs again(cuda_graph_recorder(kCuda), {});
  const BlockWrapper wrapper2 = again.wrapper();
  const auto plain_replayed = small_steps(plain, &wrapper2);
  for (size_t i = 0; i < plain_eager.size(); ++i) {
    EXPECT_TRUE(torch::equal(plain_eager[i], plain_replayed[i])) << i;
  }
  EXPECT_EQ(again.stats().failure, "");
  EXPECT_EQ(again.stats().recordings, 2);
}

// Two forwards under grad before one backward: the second runs eagerly (the first's saved
// activations in the pool stay intact for its replayed backward) and the gradients are eager's.
TEST(LayerGraphsGpu, ASecondForwardBeforeTheFirstsBackwardRunsEagerly) {
  const TrainingStream stream(kCuda);
  DecoderModel m = cuda_model("llama", torch::kFloat);
  const torch::Tensor a = cuda_ids(4), b = cuda_ids(5);
  auto two_forwards_one_backward = [&] {
    m->train();
    const torch::Tensor loss =
        causal_lm_loss(m->forward(a), a.roll(-1, 1)) + causal_lm_loss(m->forward(b), b.roll(-1, 1));
    loss.backward();
    return testing::take_grads(*m);
  };
  const auto eager = two_forwards_one_backward();
  LayerGraphs graphs(cuda_graph_recorder(kCuda), {});
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  for (int pass = 0; pass < 2; ++pass) {
    const auto got = two_forwards_one_backward();
    ASSERT_EQ(eager.size(), got.size());
    for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(torch::equal(eager[i], got[i])) << i;
  }
  const std::vector<LayerFallback> f = graphs.take_fallbacks();
  ASSERT_EQ(f.size(), 3u);
  for (const LayerFallback& one : f) EXPECT_EQ(one.cause, FallbackCause::kSecondForward);
}

}  // namespace
}  // namespace dstrain::model
