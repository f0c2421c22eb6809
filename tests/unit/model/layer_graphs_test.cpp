// Layer graphs (model/layer_graphs.h) with the replaying recorder: every replay recomputes into the
// same static buffers a CUDA graph would write, so what is around the recording — the input and
// output buffers, the gradients handed to autograd, the leaves found in the recorded graph, the
// RNG left as found, checkpointing's recompute replaying its own recording, the fallback after a
// failed recording — gives the eager model's loss and gradients bit for bit.
#include "model/layer_graphs.h"

#include <stdexcept>

#include <gtest/gtest.h>

#include "model/activation_checkpoint.h"
#include "model/model.h"
#include "replay_fault.h"
#include "test_util.h"
#include "tests/unit/model/train_pass.h"

namespace dstrain::model {
namespace {

using testing::LossAndGrads;
using testing::random_ids;
using testing::small_config_json;
using testing::train_pass;

void expect_identical(const LossAndGrads& expected, const LossAndGrads& got) {
  EXPECT_EQ(got.loss, expected.loss);
  ASSERT_EQ(expected.grads.size(), got.grads.size());
  for (size_t i = 0; i < expected.grads.size(); ++i) {
    const auto& [name, e] = expected.grads[i];
    const torch::Tensor& g = got.grads[i].second;
    ASSERT_EQ(e.defined(), g.defined()) << name;
    if (e.defined()) {
      EXPECT_TRUE(torch::equal(e, g)) << name;
    }
  }
}

DecoderModel model_of(const char* type, torch::ScalarType dtype, int layers = 3) {
  nlohmann::json doc = small_config_json(type);
  doc["num_hidden_layers"] = layers;
  if (std::string(type) == "qwen3") doc["head_dim"] = 16;
  return build_model(parse_model_config(doc), dtype, 3);
}

struct GraphsCase {
  const char* model_type;
  torch::ScalarType dtype;
  bool checkpointing;
};

class ReplayedLayers : public ::testing::TestWithParam<GraphsCase> {};

// Three passes: the first records, the others replay (the buffers then hold the previous pass's
// values, which must all be overwritten).
TEST_P(ReplayedLayers, GiveTheEagerLossAndGradientsBitForBit) {
  DecoderModel m = model_of(GetParam().model_type, GetParam().dtype);
  std::vector<torch::Tensor> ids = {random_ids(2, 24, 97, 9), random_ids(2, 24, 97, 10),
                                    random_ids(2, 24, 97, 11)};
  std::vector<LossAndGrads> eager;
  for (const auto& i : ids) eager.push_back(train_pass(*m, i));

  LayerGraphs graphs(replaying_recorder(), {GetParam().checkpointing});
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  if (GetParam().checkpointing) m->wrap_blocks(WrapperSlot::kCheckpointing, checkpoint_layers());
  for (size_t k = 0; k < ids.size(); ++k) expect_identical(eager[k], train_pass(*m, ids[k]));

  const LayerGraphStats st = graphs.stats();
  // Per layer: a forward and a backward under grad; with checkpointing also the grad-free forward.
  EXPECT_EQ(st.recordings, GetParam().checkpointing ? 9 : 6);
  EXPECT_EQ(st.replays, GetParam().checkpointing ? 27 : 18);
  EXPECT_EQ(st.eager_calls, 0);
  EXPECT_EQ(st.failure, "");
}

INSTANTIATE_TEST_SUITE_P(Families, ReplayedLayers,
                         ::testing::Values(GraphsCase{"llama", torch::kFloat, false},
                                           GraphsCase{"llama", torch::kBFloat16, false},
                                           GraphsCase{"qwen2", torch::kFloat, false},
                                           GraphsCase{"qwen2", torch::kBFloat16, true},
                                           GraphsCase{"qwen3", torch::kFloat, true},
                                           GraphsCase{"llama", torch::kFloat, true}),
                         [](const auto& info) {
                           return std::string(info.param.model_type) +
                                  (info.param.dtype == torch::kFloat ? "_fp32" : "_bf16") +
                                  (info.param.checkpointing ? "_ckpt" : "");
                         });

// Two micro-steps accumulate into .grad: a gradient buffer handed over to .grad (instead of copied)
// would be overwritten by the second replay.
TEST(ReplayedLayers, AccumulateOverMicroStepsAsEager) {
  DecoderModel m = model_of("llama", torch::kFloat);
  const torch::Tensor a = random_ids(1, 16, 97, 4), b = random_ids(1, 16, 97, 5);
  auto two_micro_steps = [&] {
    m->train();
    causal_lm_loss(m->forward(a), a.roll(-1, 1)).backward();
    causal_lm_loss(m->forward(b), b.roll(-1, 1)).backward();
    return testing::take_grads(*m);
  };
  const auto eager = two_micro_steps();
  LayerGraphs graphs(replaying_recorder(), {});
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  for (int pass = 0; pass < 2; ++pass) {
    const auto replayed = two_micro_steps();
    ASSERT_EQ(eager.size(), replayed.size());
    for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(torch::equal(eager[i], replayed[i])) << i;
  }
}

// Dropout inside a layer: warm-up and recording leave the generator as they found it, so the
// replays draw the eager masks.
class DropoutBlock final : public Block {
 public:
  explicit DropoutBlock(int64_t c) : w_(torch::randn({c, c}).requires_grad_()) {}
  torch::Tensor forward(const torch::Tensor& x, const BlockContext&) override {
    return torch::dropout(torch::matmul(x, w_), 0.3, /*train=*/true) + x;
  }
  std::vector<torch::Tensor> weights() override { return {w_}; }
  // No memory model reads this block: nothing described.
  ActivationMemory activation_memory(const ActivationRun&, Checkpointing) const override {
    return {};
  }
  torch::Tensor w_;
};

TEST(ReplayedLayers, DrawTheEagerDropoutMasks) {
  torch::manual_seed(1);
  auto block = std::make_shared<DropoutBlock>(8);
  ModelBlock mb;
  mb.name = "model.layers.0";
  mb.role = BlockRole::kLayer;
  mb.block = block;
  BlockContext ctx;  // no RoPE tables: a block that reads none
  ctx.training = true;
  const torch::Tensor x0 = torch::randn({2, 4, 8});
  auto step = [&](const BlockWrapper* wrapper) {
    torch::Tensor x = x0.clone().requires_grad_();
    const BlockFn run = [&](const torch::Tensor& in) { return block->forward(in, ctx); };
    torch::Tensor y = wrapper ? (*wrapper)(mb, x, ctx, run) : run(x);
    y.pow(2).sum().backward();
    std::vector<torch::Tensor> out = {y.detach().clone(), x.grad().clone(),
                                      block->w_.grad().clone()};
    block->w_.mutable_grad() = torch::Tensor();
    return out;
  };
  torch::manual_seed(7);
  std::vector<std::vector<torch::Tensor>> eager;
  for (int i = 0; i < 3; ++i) eager.push_back(step(nullptr));
  LayerGraphs graphs(replaying_recorder(), {});
  const BlockWrapper wrapper = graphs.wrapper();
  torch::manual_seed(7);
  for (int i = 0; i < 3; ++i) {
    const auto got = step(&wrapper);
    for (size_t k = 0; k < got.size(); ++k) EXPECT_TRUE(torch::equal(eager[i][k], got[k])) << i;
  }
  EXPECT_FALSE(torch::equal(eager[0][0], eager[1][0]));  // the masks do change between steps
}

class FailingRecorder final : public Recorder {
 public:
  bool supports(const torch::Tensor&) const override { return true; }
  void warm_up(const std::function<void()>& body) override { body(); }
  std::unique_ptr<Recording> record(const std::function<void()>& body, int pool) override {
    if (++calls_ == fail_at_) {
      throw std::runtime_error(
          "operation not permitted when stream is capturing\nException raised from ...");
    }
    return inner_->record(body, pool);
  }
  int fail_at_ = 3;  // the second layer's forward

 private:
  std::shared_ptr<Recorder> inner_ = replaying_recorder();
  int calls_ = 0;
};

TEST(ReplayedLayers, AFailedRecordingWarnsOnceAndTheLayersRunEagerly) {
  DecoderModel m = model_of("llama", torch::kFloat);
  const torch::Tensor ids = random_ids(2, 12, 97, 3);
  const LossAndGrads eager = train_pass(*m, ids);
  LayerGraphs graphs(std::make_shared<FailingRecorder>(), {});
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  ::testing::internal::CaptureStderr();
  for (int pass = 0; pass < 2; ++pass) expect_identical(eager, train_pass(*m, ids));
  const std::string err = ::testing::internal::GetCapturedStderr();
  const LayerGraphStats st = graphs.stats();
  EXPECT_EQ(st.failure, "model.layers.1: operation not permitted when stream is capturing");
  EXPECT_EQ(st.recordings, 2);       // layer 0's forward and backward
  EXPECT_EQ(st.eager_calls, 2 * 2);  // layers 1 and 2, both passes
  EXPECT_EQ(st.replays, 2 * 2);      // layer 0, both passes
  const size_t first = err.find("recording model.layers.1 failed");
  EXPECT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("recording", first + 1), std::string::npos) << "warned more than once";
}

TEST(ReplayedLayers, EvalAndGradFreeTrainingOutsideCheckpointing) {
  DecoderModel m = model_of("llama", torch::kFloat);
  const torch::Tensor ids = random_ids(1, 8, 97, 1);
  m->eval();
  const torch::Tensor eager = m->forward(ids);
  LayerGraphs graphs(replaying_recorder(), {});
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  EXPECT_TRUE(torch::equal(eager, m->forward(ids)));
  EXPECT_EQ(graphs.stats().recordings, 0);  // eval mode: eager
  m->train();
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(eager, m->forward(ids)));  // grad-free: a forward recording
  EXPECT_EQ(graphs.stats().recordings, 3);
}

TEST(ReplayedLayers, ShapesBeyondTheLimitRunEagerly) {
  DecoderModel m = model_of("llama", torch::kFloat, 2);
  LayerGraphs graphs(replaying_recorder(), {false, 2});
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  for (int64_t t : {8, 9, 10, 8}) {
    const torch::Tensor ids = random_ids(1, t, 97, t);
    (void)train_pass(*m, ids);
  }
  EXPECT_EQ(graphs.stats().recordings, 2 * 2 * 2);  // 2 shapes × 2 layers × forward + backward
  EXPECT_EQ(graphs.stats().eager_calls, 2);         // length 10
  const int64_t replays = graphs.stats().replays;
  graphs.set_enabled(false);
  (void)train_pass(*m, random_ids(1, 8, 97, 8));  // a recorded shape, but disabled: eager
  EXPECT_EQ(graphs.stats().replays, replays);
  EXPECT_EQ(graphs.stats().eager_calls, 2);  // disabled calls are not counted
  graphs.set_enabled(true);
  (void)train_pass(*m, random_ids(1, 8, 97, 8));
  EXPECT_EQ(graphs.stats().replays, replays + 2 * 2);
}

// The checks (layer_graphs.h): each fallback runs the layer eagerly at once, the step stays the
// eager step bit for bit, and take_fallbacks() names the layer and the cause once.

TEST(LayerGraphChecks, AReplayThatDiffersFromEagerRunsTheLayerEagerly) {
  for (const double delta : {1e-3, 1e-6}) {
    DecoderModel m = model_of("llama", torch::kFloat);
    const torch::Tensor ids = random_ids(2, 12, 97, 3);
    const LossAndGrads eager = train_pass(*m, ids);
    const torch::Tensor w = m->decoder_layer(1)->mlp->down_proj->weight;
    LayerGraphs graphs(std::make_shared<testing::PerturbedReplays>(w, delta), {});
    m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
    for (int pass = 0; pass < 2; ++pass) expect_identical(eager, train_pass(*m, ids));
    const std::vector<LayerFallback> f = graphs.take_fallbacks();
    ASSERT_EQ(f.size(), 1u) << delta;
    EXPECT_EQ(graphs.block_name(f[0].layer), "model.layers.1");
    EXPECT_EQ(f[0].cause, FallbackCause::kReplayDiffers);
    EXPECT_GT(f[0].error, f[0].bound);
    EXPECT_FALSE(f[0].detail.empty());
    EXPECT_TRUE(graphs.take_fallbacks().empty()) << "taken once";
    const LayerGraphStats st = graphs.stats();
    EXPECT_EQ(st.eager_layers, 1);
    EXPECT_EQ(st.eager_calls, 2);      // layer 1, both passes
    EXPECT_EQ(st.replays, 2 * 2 * 2);  // layers 0 and 2, forward and backward, both passes
    EXPECT_EQ(st.failure, "");
  }
}

TEST(LayerGraphChecks, ReplaysWithinTheEagerRunsOwnRoundingPass) {
  // A shift far below float32's resolution of the weights leaves every replay bit-identical.
  DecoderModel m = model_of("llama", torch::kFloat);
  const torch::Tensor ids = random_ids(2, 12, 97, 3);
  const torch::Tensor w = m->decoder_layer(1)->mlp->down_proj->weight;
  LayerGraphs graphs(std::make_shared<testing::PerturbedReplays>(w, 1e-30), {});
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  (void)train_pass(*m, ids);
  EXPECT_TRUE(graphs.take_fallbacks().empty());
  EXPECT_EQ(graphs.stats().eager_calls, 0);
}

TEST(LayerGraphChecks, AParameterThatMovedRunsTheLayerEagerly) {
  DecoderModel m = model_of("qwen2", torch::kFloat);
  const torch::Tensor ids = random_ids(2, 12, 97, 3);
  const LossAndGrads eager = train_pass(*m, ids);
  LayerGraphs graphs(replaying_recorder(), {});
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  expect_identical(eager, train_pass(*m, ids));
  EXPECT_TRUE(graphs.take_fallbacks().empty());
  {
    torch::NoGradGuard no_grad;
    torch::Tensor bias = m->decoder_layer(0)->self_attn->k_proj->bias;
    bias.set_data(bias.detach().clone());  // the same values elsewhere
  }
  expect_identical(eager, train_pass(*m, ids));
  const std::vector<LayerFallback> f = graphs.take_fallbacks();
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(graphs.block_name(f[0].layer), "model.layers.0");
  EXPECT_EQ(f[0].cause, FallbackCause::kParameterMoved);
  EXPECT_EQ(f[0].detail, "model.layers.0.self_attn.k_proj.bias");
  EXPECT_EQ(graphs.stats().eager_calls, 1);
}

TEST(LayerGraphChecks, ASecondForwardBeforeTheFirstsBackwardRunsEagerly) {
  DecoderModel m = model_of("llama", torch::kFloat);
  const torch::Tensor a = random_ids(2, 12, 97, 4), b = random_ids(2, 12, 97, 5);
  auto two_forwards_one_backward = [&] {
    m->train();
    const torch::Tensor loss =
        causal_lm_loss(m->forward(a), a.roll(-1, 1)) + causal_lm_loss(m->forward(b), b.roll(-1, 1));
    loss.backward();
    return testing::take_grads(*m);
  };
  const auto eager = two_forwards_one_backward();
  LayerGraphs graphs(replaying_recorder(), {});
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  for (int pass = 0; pass < 2; ++pass) {
    const auto got = two_forwards_one_backward();
    ASSERT_EQ(eager.size(), got.size());
    for (size_t i = 0; i < eager.size(); ++i) EXPECT_TRUE(torch::equal(eager[i], got[i])) << i;
  }
  const std::vector<LayerFallback> f = graphs.take_fallbacks();
  ASSERT_EQ(f.size(), 3u);  // every layer, once
  for (const LayerFallback& one : f) EXPECT_EQ(one.cause, FallbackCause::kSecondForward);
  EXPECT_EQ(graphs.stats().eager_layers, 3);
  graphs.run_eagerly({f[0].layer});  // agreed: no change, already eager here
  EXPECT_EQ(graphs.stats().eager_layers, 3);
}

// A recorder whose pools grow by 1000 bytes a recording.
class CountingPools final : public Recorder {
 public:
  bool supports(const torch::Tensor&) const override { return true; }
  void warm_up(const std::function<void()>& body) override { body(); }
  std::unique_ptr<Recording> record(const std::function<void()>& body, int pool) override {
    bytes_ += 1000;
    return inner_->record(body, pool);
  }
  int64_t pool_bytes() const override { return bytes_; }

 private:
  std::shared_ptr<Recorder> inner_ = replaying_recorder();
  int64_t bytes_ = 0;
};

TEST(LayerGraphChecks, RecordingStopsOncePoolsExceedTheirBudget) {
  DecoderModel m = model_of("llama", torch::kFloat);
  const torch::Tensor ids = random_ids(2, 12, 97, 3);
  const LossAndGrads eager = train_pass(*m, ids);
  LayerGraphOptions options;
  options.pool_budget = 3500;  // layers 0 and 1 (2000, then 4000 bytes); layer 2 is over
  LayerGraphs graphs(std::make_shared<CountingPools>(), options);
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  ::testing::internal::CaptureStderr();
  for (int pass = 0; pass < 2; ++pass) expect_identical(eager, train_pass(*m, ids));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(graphs.stats().recordings, 4);
  EXPECT_EQ(graphs.stats().eager_calls, 2);  // layer 2, both passes
  EXPECT_NE(err.find("over the 0.0 MiB the memory plan allows them; model.layers.2 and every layer "
                     "not recorded yet run eagerly"),
            std::string::npos)
      << err;
}

// LayerGraphOptions::min_speedup: the first-use check times each layer's eager run and a replay
// (here a recorder whose timings are given); at the first take_fallbacks(), replays slower than
// eager/min_speedup over all layers send every layer back to eager (one fallback each, with the
// timings), the step still eager's bit for bit.
TEST(LayerGraphChecks, ReplaysNotFasterThanTheRuleRunEveryLayerEagerly) {
  DecoderModel m = model_of("llama", torch::kFloat);
  const torch::Tensor ids = random_ids(2, 12, 97, 3);
  const LossAndGrads eager = train_pass(*m, ids);
  LayerGraphOptions options;
  options.min_speedup = 1.25;
  LayerGraphs graphs(std::make_shared<testing::TimedReplays>(1.0, 0.9), options);
  m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
  expect_identical(eager, train_pass(*m, ids));
  const LayerGraphStats first = graphs.stats();
  EXPECT_EQ(first.first_use_eager_seconds, 3.0) << "3 layers";
  EXPECT_DOUBLE_EQ(first.first_use_replay_seconds, 2.7);
  const std::vector<LayerFallback> f = graphs.take_fallbacks();
  ASSERT_EQ(f.size(), 3u);
  for (size_t i = 0; i < f.size(); ++i) {
    EXPECT_EQ(graphs.block_name(f[i].layer), "model.layers." + std::to_string(i));
    EXPECT_EQ(f[i].cause, FallbackCause::kNoGain);
    EXPECT_DOUBLE_EQ(f[i].error, 2.7) << "the replays' time";
    EXPECT_DOUBLE_EQ(f[i].bound, 3.0 / 1.25) << "the most that pays";
  }
  expect_identical(eager, train_pass(*m, ids));
  EXPECT_EQ(graphs.stats().eager_calls, 3) << "the second pass, every layer";
  EXPECT_TRUE(graphs.take_fallbacks().empty()) << "judged once";
}

TEST(LayerGraphChecks, ReplaysWithinTheRuleOrNoRuleKeepTheRecordings) {
  for (const double min_speedup : {1.25, 0.0}) {
    DecoderModel m = model_of("llama", torch::kFloat);
    const torch::Tensor ids = random_ids(2, 12, 97, 3);
    LayerGraphOptions options;
    options.min_speedup = min_speedup;
    // Faster by the rule's 1.25 and more; slower, where there is no rule.
    const double replay = min_speedup > 0 ? 0.5 : 2.0;
    LayerGraphs graphs(std::make_shared<testing::TimedReplays>(1.0, replay), options);
    m->wrap_blocks(WrapperSlot::kGraphs, graphs.wrapper());
    for (int pass = 0; pass < 2; ++pass) {
      (void)train_pass(*m, ids);
      EXPECT_TRUE(graphs.take_fallbacks().empty()) << min_speedup;
    }
    EXPECT_EQ(graphs.stats().eager_calls, 0) << min_speedup;
    EXPECT_EQ(graphs.stats().first_use_replay_seconds, 3 * replay) << min_speedup;
  }
}

}  // namespace
}  // namespace dstrain::model
