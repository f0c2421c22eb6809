// parallelize() acts on the model's block list only: a block type the model has never seen, added
// by a test, is sharded as its own ZeRO-3 unit, gets LoRA adapters and is checkpointed with no
// change anywhere else; and the block list of a model built without memory serves the estimator
// and LoRA's target matching for a 70B config without allocating anything.
#include "train/parallelize.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>

#include <gtest/gtest.h>

#include "estimate/model_states.h"
#include "lora/targets.h"
#include "model/model.h"
#include "model/storage.h"
#include "optim/optimizer.h"
#include "tests/common/thread_communicator.h"
#include "tests/unit/model/counting_allocator.h"
#include "tests/unit/model/test_util.h"
#include "tests/unit/train/engine_test_util.h"

namespace dstrain::train {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;

// A block the model does not know: a gated residual projection, h + sigmoid(gate) ⊙ (h·Wᵀ), whose
// projection can carry an adapter. It counts its forwards (a recompute is one more).
class GatedResidualImpl : public torch::nn::Module, public model::Block {
 public:
  GatedResidualImpl(int64_t C, model::Materialize m) {
    proj = register_module("proj", model::Linear(C, C, /*bias=*/false, m));
    gate = register_parameter("gate", m == model::Materialize::kYes
                                          ? torch::zeros({C})
                                          : model::unmaterialized({C}, torch::kFloat));
  }
  torch::Tensor forward(const torch::Tensor& h, const model::BlockContext&) override {
    ++forwards;
    return h + torch::sigmoid(gate) * model::project(*proj, h, is_training());
  }
  std::vector<torch::Tensor> weights() override { return parameters(); }
  std::vector<model::Projection> projections() override { return {{"proj", proj}}; }
  // Keeps h and h·Wᵀ (the product's inputs), or checkpointed h alone.
  model::ActivationMemory activation_memory(const model::ActivationRun& run,
                                            model::Checkpointing s) const override {
    const int64_t h = run.tokens * run.element_bytes * gate.size(0);
    return {h, s == model::Checkpointing::kNone ? 2 * h : h, 0, 0, 2 * h};
  }

  model::Linear proj{nullptr};  // [C, C]
  torch::Tensor gate;           // [C]
  std::atomic<int> forwards{0};
};

struct ToyRun {
  std::vector<std::vector<double>> losses{2};  // per rank
  std::vector<int> toy_forwards{0, 0};         // per rank
  double toy_lora_b = 0;                       // Σ|B| of the toy's adapter over the ranks' pieces
  std::vector<std::pair<std::string, int>> toy_units;  // the toy's parameters with their unit
};

// A 2-layer model with the toy block between its layers, LoRA on q_proj and the toy's projection,
// trained on 2 ranks for `steps` steps.
ToyRun train_toy(int stage, bool checkpointing, int steps) {
  const model::ModelConfig config = model::testing::small_config();
  ToyRun run;
  std::mutex mutex;
  // Drawn once, before the rank threads: they would share (and race on) torch's global generator.
  torch::manual_seed(7);
  const torch::Tensor ids = torch::randint(0, config.vocab_size, {4, 12});
  run_ranks(2, [&](ThreadCommunicator& comm) {
    torch::set_num_threads(1);
    model::DecoderModel m(config, model::Materialize::kNo);
    auto toy = std::make_shared<GatedResidualImpl>(config.hidden_size, model::Materialize::kNo);
    m->add_block(2, "toy", toy);  // embedding, layer 0, toy, layer 1, head
    ParallelPlan plan;
    plan.lora = LoraPlan{};
    plan.lora->options.r = 4;
    plan.lora->options.alpha = 8;
    plan.lora->options.target_modules = {"q_proj", "proj"};
    plan.lora->key = "test";
    plan.checkpointing = checkpointing ? model::Checkpointing::kPlain : model::Checkpointing::kNone;
    plan.engine.stage = stage;
    plan.engine.param_persistence_threshold = 0;  // the toy's gate is in its unit too
    plan.engine.prefetch_bucket_size = 0;
    plan.optimizer = testing::adamw();
    plan.initial_values = model::init_source(*m, 3);
    SequenceParallel no_sp(nullptr);
    Parallelized parallel = parallelize(m, {comm, torch::kCPU, no_sp}, std::move(plan));
    m->train();
    const auto r = static_cast<size_t>(comm.rank());
    const torch::Tensor mine = ids.narrow(0, 2 * comm.rank(), 2);
    for (int s = 0; s < steps; ++s) {
      const model::LossSum loss = m->loss_sum(mine, mine.roll(-1, 1), /*fused=*/true);
      parallel.engine->backward(loss.mean());
      parallel.engine->step(3e-2);
      run.losses[r].push_back(loss.mean().item<double>());
    }
    std::lock_guard<std::mutex> lock(mutex);
    run.toy_forwards[r] = toy->forwards;
    for (const zero::StatePiece& piece : parallel.engine->owned_state()) {
      if (piece.param == "toy.proj.lora_B.weight")
        run.toy_lora_b += piece.tensors.at("master").abs().sum().item<double>();
    }
    if (r != 0) return;
    for (const zero::NamedParameter& p : engine_parameters(*m, parallel.lora.get())) {
      if (p.name.rfind("toy.", 0) == 0) run.toy_units.emplace_back(p.name, p.unit);
    }
  });
  return run;
}

TEST(Parallelize, ANewBlockTypeTrainsAtStage3WithLoraAndCheckpointing) {
  const int steps = 6;
  const ToyRun sharded = train_toy(3, /*checkpointing=*/true, steps);
  const ToyRun plain = train_toy(0, /*checkpointing=*/false, steps);
  // A module's own parameters come before its children's.
  const std::vector<std::pair<std::string, int>> units = {{"toy.gate", 2},
                                                          {"toy.proj.weight", 2},
                                                          {"toy.proj.lora_A.weight", 2},
                                                          {"toy.proj.lora_B.weight", 2}};
  EXPECT_EQ(sharded.toy_units, units) << "the toy block is not a stage-3 unit of its own";
  for (size_t r = 0; r < 2; ++r) {
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(sharded.losses[r][s], plain.losses[r][s], 1e-5 * plain.losses[r][s])
          << "rank " << r << " step " << s;
    }
    EXPECT_LT(sharded.losses[r].back(), sharded.losses[r].front() - 0.01) << "rank " << r;
    EXPECT_EQ(sharded.toy_forwards[r], 2 * steps) << "rank " << r << ": not recomputed once";
    EXPECT_EQ(plain.toy_forwards[r], steps) << "rank " << r;
  }
  EXPECT_GT(sharded.toy_lora_b, 0) << "the toy's adapter was not trained";
}

// Llama-3-70B's shapes.
model::ModelConfig config_70b() {
  return model::parse_model_config({{"model_type", "llama"},
                                    {"vocab_size", 128256},
                                    {"hidden_size", 8192},
                                    {"intermediate_size", 28672},
                                    {"num_hidden_layers", 80},
                                    {"num_attention_heads", 64},
                                    {"num_key_value_heads", 8},
                                    {"max_position_embeddings", 8192},
                                    {"rms_norm_eps", 1e-5},
                                    {"rope_theta", 500000.0},
                                    {"tie_word_embeddings", false}});
}

TEST(Parallelize, A70BBlockListServesTheEstimatorAndLoraTargetsWithoutAllocating) {
  const model::ModelConfig config = config_70b();
  model::testing::CountingScope scope;
  model::testing::CountingAllocator& counter = scope.counter();
  const int64_t before = counter.current();
  counter.reset_peak();
  const auto start = std::chrono::steady_clock::now();
  model::DecoderModel m(config, model::Materialize::kNo);
  const std::vector<lora::TargetModule> targets =
      lora::resolve_targets(*m, {"q_proj", "v_proj"}, false, "lora.target_modules");
  const std::vector<estimate::ParamShape> shapes = estimate::parameter_shapes(*m);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const int64_t peak = counter.peak() - before;
  RecordProperty("milliseconds", std::to_string(ms));
  RecordProperty("peak_bytes", std::to_string(peak));
  EXPECT_EQ(targets.size(), 160u);
  EXPECT_EQ(targets[2].path, "model.layers.1.self_attn.q_proj");
  EXPECT_EQ(targets[2].block, 2u);
  int64_t total = 0;
  for (const estimate::ParamShape& s : shapes) total += s.numel;
  EXPECT_EQ(total, config.num_parameters(true));
  EXPECT_EQ(shapes.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(shapes.back().name, "lm_head.weight");
  EXPECT_EQ(shapes.back().unit, 81);
  // A materialised layer alone is 3.4 GB: anything proportional to the model shows here.
  EXPECT_LT(peak, int64_t{1} << 20) << "bytes allocated while building and reading the list";
  EXPECT_LT(ms, 5000.0) << "building a 70B model without memory took " << ms << " ms";
}

}  // namespace
}  // namespace dstrain::train
