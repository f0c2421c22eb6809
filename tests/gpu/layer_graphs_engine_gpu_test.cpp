// CUDA graphs per layer through parallelize() with a real ZeRO engine on a GPU, as the trainer runs
// them (one TrainingStream current from before the engine is built; the gradient accumulators,
// recordings and replays on it): stages 0-3, LoRA, checkpointing, bf16 and fp32, 4 micro-steps per
// step and updates between. Losses, gradient norms and the masters after the steps equal the
// eager run's bit for bit; every layer is recorded and replayed (no recording failed, no first-use
// check fell back, no parameter moved), none runs eagerly. These tiny layers at 64 tokens are
// bound by kernel launches if anything is: the first-use timing must find the replays at least
// kAutoMinSpeedup times faster than eager (training.cuda_graphs: auto's rule keeps them); the
// timings are printed. One rank (an in-process communicator): the engine's hooks, buckets, gathers
// and releases run as on more. Exits 77 without a device.
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "model/layer_graphs.h"
#include "model/model.h"
#include "tests/common/thread_communicator.h"
#include "tests/unit/model/test_util.h"
#include "tests/unit/train/engine_test_util.h"
#include "train/graphs_choice.h"
#include "train/parallelize.h"
#include "train/sequence_parallel.h"

namespace dstrain::train {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;

const torch::Device kCuda(torch::kCUDA, 0);
constexpr int kSteps = 3;
constexpr int kMicroSteps = 4;

struct GraphsSetup {
  const char* model_type;
  torch::ScalarType dtype;
  int stage;
  bool lora;
  bool checkpointing;
  const char* name;
};

struct GraphsRun {
  std::vector<double> losses, norms;
  std::map<std::string, torch::Tensor> masters;
  model::LayerGraphStats stats;
  std::vector<std::string> fallbacks;
};

GraphsRun train(const GraphsSetup& s, bool graphs) {
  torch::manual_seed(7);
  const torch::Tensor ids = torch::randint(0, 97, {kMicroSteps, 64}).to(kCuda);
  GraphsRun run;
  run_ranks(1, [&](ThreadCommunicator& comm) {
    const model::TrainingStream stream(kCuda);
    model::DecoderModel m(model::testing::small_config(s.model_type), model::Materialize::kNo);
    ParallelPlan plan;
    if (s.lora) plan.lora = testing::small_lora({"q_proj", "k_proj", "v_proj", "o_proj"});
    plan.checkpointing =
        s.checkpointing ? model::Checkpointing::kPlain : model::Checkpointing::kNone;
    if (graphs) plan.graph_recorder = model::cuda_graph_recorder(kCuda);
    plan.engine.stage = s.stage;
    plan.engine.compute_dtype = s.dtype;
    plan.engine.param_persistence_threshold = 100;
    plan.engine.prefetch_bucket_size = 0;
    plan.optimizer = testing::sgd();
    plan.initial_values = model::init_source(*m, 3);
    SequenceParallel no_sp(nullptr);
    Parallelized parallel = parallelize(m, {comm, kCuda, no_sp}, std::move(plan));
    m->train();
    for (int step = 0; step < kSteps; ++step) {
      for (int micro = 0; micro < kMicroSteps; ++micro) {
        const torch::Tensor mine = ids.narrow(0, micro, 1);
        const model::LossSum loss = m->loss_sum(mine, mine.roll(-1, 1), /*fused=*/true);
        parallel.engine->backward(loss.mean(), {micro, kMicroSteps});
        run.losses.push_back(loss.mean().item<double>());
      }
      run.norms.push_back(parallel.engine->step(0.5).grad_norm());
    }
    torch::cuda::synchronize();
    run.masters = testing::masters(*parallel.engine, 0);
    if (graphs) {
      run.stats = parallel.graphs->stats();
      for (const model::LayerFallback& f : parallel.graphs->take_fallbacks()) {
        run.fallbacks.push_back(parallel.graphs->block_name(f.layer) + ": " +
                                model::fallback_cause_text(f.cause) + " " + f.detail + " (" +
                                std::to_string(f.error) + " > " + std::to_string(f.bound) + ")");
      }
    }
  });
  return run;
}

TEST(LayerGraphsEngineGpu, ReplayedStepsEqualEagerStepsAtEveryStage) {
  const std::vector<GraphsSetup> setups = {
      {"llama", torch::kFloat, 0, false, false, "llama fp32 stage 0"},
      {"llama", torch::kBFloat16, 1, false, false, "llama bf16 stage 1"},
      {"llama", torch::kBFloat16, 2, false, true, "llama bf16 stage 2 checkpointing"},
      {"qwen2", torch::kBFloat16, 3, false, false, "qwen2 bf16 stage 3"},
      {"qwen2", torch::kBFloat16, 2, true, false, "qwen2 bf16 stage 2 lora"},
      {"qwen2", torch::kFloat, 3, true, true, "qwen2 fp32 stage 3 lora checkpointing"},
  };
  for (const GraphsSetup& s : setups) {
    const GraphsRun eager = train(s, false);
    const GraphsRun again = train(s, false);
    ASSERT_EQ(again.losses, eager.losses) << s.name << ": eager does not repeat itself";
    const GraphsRun replayed = train(s, true);
    EXPECT_EQ(replayed.losses, eager.losses) << s.name;
    EXPECT_EQ(replayed.norms, eager.norms) << s.name;
    ASSERT_EQ(replayed.masters.size(), eager.masters.size()) << s.name;
    for (const auto& [key, master] : eager.masters) {
      EXPECT_TRUE(torch::equal(master.cpu(), replayed.masters.at(key).cpu())) << s.name << key;
    }
    EXPECT_EQ(replayed.stats.failure, "") << s.name;
    EXPECT_EQ(replayed.stats.eager_calls, 0) << s.name;
    EXPECT_GT(replayed.stats.replays, 0) << s.name;
    EXPECT_TRUE(replayed.fallbacks.empty())
        << s.name << ": " << (replayed.fallbacks.empty() ? "" : replayed.fallbacks[0]);
    const double eager_ms = replayed.stats.first_use_eager_seconds * 1e3,
                 replay_ms = replayed.stats.first_use_replay_seconds * 1e3;
    std::cout << s.name << ": first use, all layers: eager " << eager_ms << " ms, replayed "
              << replay_ms << " ms\n";
    EXPECT_GE(eager_ms, kAutoMinSpeedup * replay_ms) << s.name;
  }
}

}  // namespace
}  // namespace dstrain::train
