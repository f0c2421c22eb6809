// ZeRO-3 model construction: a rank builds the model without memory and fills only its shard,
// from the seeded initialisation or from ranges of the safetensors files, and trains exactly as a
// rank that built the whole model first.

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "lora/lora_model.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "optim/optimizer.h"
#include "tests/common/thread_communicator.h"
#include "tests/unit/model/counting_allocator.h"
#include "tests/unit/model/test_util.h"
#include "train/parallelize.h"
#include "zero/engine.h"

namespace dstrain::train {
namespace {

using dstrain::testing::ThreadCommunicator;

model::ModelConfig deep_config(int64_t layers) {
  auto j = model::testing::small_config_json("qwen2");
  j["num_hidden_layers"] = layers;
  j["vocab_size"] = 211;
  return model::parse_model_config(j);
}

zero::OptimizerFactory adamw() {
  return [](int64_t numel, std::vector<optim::Range> no_decay) {
    optim::AdamWOptions o;
    o.weight_decay = 0.1;
    o.no_decay = std::move(no_decay);
    return optim::make_adamw(numel, o);
  };
}

// Stage 3 in `dtype`; parallelize() sets the segments (the model's blocks).
ParallelPlan stage3_plan(torch::ScalarType dtype) {
  ParallelPlan plan;
  plan.engine.stage = 3;
  plan.engine.compute_dtype = dtype;
  plan.engine.param_persistence_threshold = 100;  // norms persistent, everything else sharded
  plan.engine.prefetch_bucket_size = 5000;
  plan.optimizer = adamw();
  return plan;
}

// Losses of `steps` steps on fixed data at world size 2, stage 3; `make` builds each rank's model
// and says where the engine's initial values come from.
using Maker = std::function<model::DecoderModel(zero::InitialValues*)>;
std::vector<double> train_stage3(const Maker& make, torch::ScalarType dtype, int steps = 3) {
  std::vector<std::vector<double>> losses(2);
  dstrain::testing::run_ranks(2, [&](ThreadCommunicator& comm) {
    zero::InitialValues values;
    model::DecoderModel m = make(&values);
    ParallelPlan plan = stage3_plan(dtype);
    plan.initial_values = values;
    SequenceParallel no_sp(nullptr);
    Parallelized parallel = parallelize(m, {comm, torch::kCPU, no_sp}, plan);
    zero::Engine* engine = parallel.engine.get();
    for (int s = 0; s < steps; ++s) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(100 * s + comm.rank());
      const torch::Tensor ids = torch::randint(0, m->config().vocab_size, {2, 12}, gen);
      const torch::Tensor loss = model::causal_lm_loss(m->forward(ids), ids.roll(-1, 1));
      engine->backward(loss);
      engine->step(1e-2);
      losses[static_cast<size_t>(comm.rank())].push_back(loss.item<double>());
    }
  });
  losses[0].insert(losses[0].end(), losses[1].begin(), losses[1].end());
  return losses[0];
}

TEST(ShardedBuild, SeededShardsTrainExactlyLikeTheFullModel) {
  const model::ModelConfig c = deep_config(3);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const auto full = train_stage3(
        [&](zero::InitialValues*) { return model::build_model(c, torch::kFloat, 5); }, dtype);
    const auto sharded = train_stage3(
        [&](zero::InitialValues* v) {
          model::DecoderModel m(c, model::Materialize::kNo);
          *v = model::init_source(*m, 5);
          return m;
        },
        dtype);
    EXPECT_EQ(full, sharded) << c10::toString(dtype);
    const auto other_seed = train_stage3(
        [&](zero::InitialValues* v) {
          model::DecoderModel m(c, model::Materialize::kNo);
          *v = model::init_source(*m, 6);
          return m;
        },
        dtype);
    EXPECT_NE(full, other_seed);
  }
}

TEST(ShardedBuild, SafetensorsRangesTrainExactlyLikeLoadedWeights) {
  model::testing::TempDir dir;
  const model::ModelConfig c = deep_config(2);
  model::save_weights(*model::build_model(c, torch::kFloat, 9), dir.path(), torch::kFloat);
  const auto loaded = train_stage3(
      [&](zero::InitialValues*) {
        model::DecoderModel m = model::build_model(c, torch::kFloat, 1);
        model::load_weights(*m, dir.path());
        return m;
      },
      torch::kFloat);
  const auto ranges = train_stage3(
      [&](zero::InitialValues* v) {
        model::DecoderModel m(c, model::Materialize::kNo);
        auto files = std::make_shared<model::SafetensorsSet>(dir.path());
        model::check_weights(*files, *m, dir.path());
        *v = [files](const std::string& name, int64_t b, int64_t e) {
          return files->read_range(name, b, e);
        };
        return m;
      },
      torch::kFloat);
  EXPECT_EQ(loaded, ranges);
}

// LoRA at stage 3: the frozen base is sharded (each rank holds half of it in the compute dtype),
// gathered per layer only while used, and only the adapters get gradients and optimizer state.
TEST(ShardedBuild, LoraBaseIsShardedFrozenAndReleasedAfterEachStep) {
  const model::ModelConfig c = deep_config(4);
  const int64_t base_numel = c.num_parameters(true);
  dstrain::testing::run_ranks(2, [&](ThreadCommunicator& comm) {
    model::DecoderModel m(c, model::Materialize::kNo);
    ParallelPlan plan = stage3_plan(torch::kBFloat16);
    plan.engine.param_persistence_threshold = 0;
    plan.initial_values = model::init_source(*m, 5);
    plan.lora = LoraPlan{};
    plan.lora->options.r = 4;
    plan.lora->options.alpha = 8;
    plan.lora->options.target_modules = {"q_proj", "v_proj"};
    plan.lora->key = "test";
    SequenceParallel no_sp(nullptr);
    Parallelized parallel = parallelize(m, {comm, torch::kCPU, no_sp}, plan);
    zero::Engine* engine = parallel.engine.get();
    int64_t adapter_numel = 0;
    for (auto& [name, t] : parallel.lora->named_parameters()) adapter_numel += t.numel();
    double first = 0, last = 0;
    const torch::Tensor ids = torch::arange(24).reshape({2, 12}) % c.vocab_size;
    for (int s = 0; s < 8; ++s) {
      const torch::Tensor loss = model::causal_lm_loss(m->forward(ids), ids.roll(-1, 1));
      engine->backward(loss);
      engine->step(3e-2);
      (s == 0 ? first : last) = loss.item<double>();
      const zero::MemoryReport r = engine->bytes();
      EXPECT_EQ(r.gathered_params, 0) << "units left gathered after step " << s;
    }
    const zero::MemoryReport r = engine->bytes();
    // bf16 compute params: half the base plus half the adapters, up to padding.
    EXPECT_NEAR(static_cast<double>(r.compute_params), (base_numel + adapter_numel) * 2.0 / 2,
                64.0 * 16);
    EXPECT_EQ(r.master_weights, adapter_numel * 4 / 2);  // fp32, adapters only
    EXPECT_EQ(r.gradients, adapter_numel * 2 / 2);
    EXPECT_LT(r.gathered_params_peak, base_numel) << "at most a few units gathered at once";
    EXPECT_LT(last, first - 0.05) << "the adapters did not learn";
    for (auto& p : m->parameters()) EXPECT_FALSE(p.grad().defined());
  });
}

// Rank 3 of 8, for building an engine alone: construction does not communicate.
class SilentCommunicator final : public comm::Communicator {
 public:
  int rank() const override { return 3; }
  int world_size() const override { return 8; }
  std::unique_ptr<comm::Work> all_reduce(torch::Tensor&, comm::ReduceOp) override { return none(); }
  std::unique_ptr<comm::Work> reduce_scatter(torch::Tensor&, const torch::Tensor&,
                                             comm::ReduceOp) override {
    return none();
  }
  std::unique_ptr<comm::Work> all_gather(torch::Tensor&, const torch::Tensor&) override {
    return none();
  }
  std::unique_ptr<comm::Work> broadcast(torch::Tensor&, int) override { return none(); }
  void barrier() override { none(); }
  std::unique_ptr<comm::Work> all_to_all(torch::Tensor&, const torch::Tensor&) override {
    return none();
  }
  std::unique_ptr<comm::Work> all_to_all_v(torch::Tensor&, const torch::Tensor&,
                                           std::vector<int64_t>, std::vector<int64_t>) override {
    return none();
  }
  std::unique_ptr<comm::Work> exchange(std::vector<comm::PeerTransfer>) override { return none(); }
  std::unique_ptr<comm::Communicator> split(int) override {
    none();
    return nullptr;
  }

 private:
  static std::unique_ptr<comm::Work> none() {
    ADD_FAILURE() << "construction communicated";
    throw std::runtime_error("no communication expected");
  }
};

// Peak bytes allocated while building the model and a stage-3 engine on rank 3 of 8.
int64_t construction_peak(bool sharded) {
  const model::ModelConfig c = deep_config(12);
  SilentCommunicator comm;
  model::testing::CountingScope scope;
  model::testing::CountingAllocator& counter = scope.counter();
  const int64_t before = counter.current();
  counter.reset_peak();
  model::DecoderModel m = sharded ? model::DecoderModel(c, model::Materialize::kNo)
                                  : model::build_model(c, torch::kFloat, 5);
  ParallelPlan plan = stage3_plan(torch::kFloat);
  if (sharded) plan.initial_values = model::init_source(*m, 5);
  SequenceParallel no_sp(nullptr);
  const Parallelized parallel = parallelize(m, {comm, torch::kCPU, no_sp}, plan);
  return counter.peak() - before;
}

TEST(ShardedBuild, ARankNeverHoldsTheWholeModelWhileBuilding) {
  const model::ModelConfig c = deep_config(12);
  const int64_t model_bytes = 4 * c.num_parameters(true);
  const int64_t sharded = construction_peak(true);
  const int64_t full = construction_peak(false);
  RecordProperty("model_bytes", std::to_string(model_bytes));
  RecordProperty("sharded_peak", std::to_string(sharded));
  RecordProperty("full_peak", std::to_string(full));
  // Model states at stage 3 are 16Ψ/N bytes = model_bytes / 2 at N = 8, plus one unit in transit.
  EXPECT_LT(sharded, model_bytes * 3 / 4) << "full model " << model_bytes << " bytes";
  EXPECT_GT(full, model_bytes) << "the check must see a full build";
}

}  // namespace
}  // namespace dstrain::train
