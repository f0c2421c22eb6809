// Layer graphs (model/layer_graphs.h) under the ZeRO engines, through parallelize(): with the
// replaying recorder (every replay recomputes into the buffers a CUDA graph would write), stages
// 0-3 on 2 ranks with gradient accumulation, LoRA and checkpointing give the eager run's losses,
// gradient norms and updates bit for bit: the gradients handed to autograd reach each parameter's
// accumulator once per backward and the engines' hooks see them as without graphs. Stage 3 keeps
// its gathered memory where graphs are on (they read the parameters where they were recorded).
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "model/layer_graphs.h"
#include "model/model.h"
#include "model/storage.h"
#include "optim/optimizer.h"
#include "tests/common/thread_communicator.h"
#include "tests/unit/model/replay_fault.h"
#include "tests/unit/model/test_util.h"
#include "tests/unit/train/engine_test_util.h"
#include "train/graphs_choice.h"
#include "train/parallelize.h"
#include "train/sequence_parallel.h"
#include "zero/engine.h"

namespace dstrain::train {
namespace {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;
using testing::sgd;

struct GraphsSetup {
  const char* model_type;
  torch::ScalarType dtype;
  int stage;
  bool lora = false;
  bool checkpointing = false;
  int perturbed_rank = -1;  // this rank's replays of layer 1 read a shifted down_proj weight
  int slow_rank = -1;       // this rank's replays wait 0.1 s each (model::testing::SlowReplays)
  double min_speedup = 0;   // ParallelPlan::graph_min_speedup
};

std::string describe_graphs(const GraphsSetup& s) {
  return std::string(s.model_type) + (s.dtype == torch::kFloat ? " fp32" : " bf16") + " stage " +
         std::to_string(s.stage) + (s.lora ? " lora" : "") + (s.checkpointing ? " ckpt" : "");
}

struct GraphsRun {
  std::vector<double> losses, norms;             // rank 0's, per micro-step / step
  std::map<std::string, torch::Tensor> masters;  // after the steps, "rank:param@begin"
  model::LayerGraphStats stats;                  // rank 0's
  int64_t layer_weight_bytes = 0;                // rank 0: a layer weight's storage after the run
  std::vector<std::vector<size_t>> agreed;       // rank 0: agree_graph_fallbacks' after each step
  std::vector<int64_t> eager_layers = {0, 0};    // each rank's, after the run
};

constexpr int kSteps = 3;
constexpr int kMicroSteps = 2;

void train_rank(const GraphsSetup& s, bool graphs, const torch::Tensor& ids,
                ThreadCommunicator& comm, GraphsRun& run, std::mutex& mutex) {
  torch::set_num_threads(1);
  model::DecoderModel m(model::testing::small_config(s.model_type), model::Materialize::kNo);
  ParallelPlan plan;
  if (s.lora) plan.lora = testing::small_lora({"q_proj", "k_proj", "v_proj", "o_proj"});
  plan.checkpointing = s.checkpointing ? model::Checkpointing::kPlain : model::Checkpointing::kNone;
  if (graphs) plan.graph_recorder = model::replaying_recorder();
  if (graphs && comm.rank() == s.perturbed_rank) {
    plan.graph_recorder = std::make_shared<model::testing::PerturbedReplays>(
        m->decoder_layer(1)->mlp->down_proj->weight, 1e-3);
  }
  if (graphs && s.min_speedup > 0) {
    plan.graph_recorder =
        std::make_shared<model::testing::TimedReplays>(1.0, comm.rank() == s.slow_rank ? 2.0 : 0.1);
  }
  plan.graph_min_speedup = s.min_speedup;
  plan.engine.stage = s.stage;
  plan.engine.compute_dtype = s.dtype;
  plan.engine.param_persistence_threshold = 100;
  plan.engine.prefetch_bucket_size = 0;
  plan.optimizer = sgd();
  plan.initial_values = model::init_source(*m, 3);
  SequenceParallel no_sp(nullptr);
  Parallelized parallel = parallelize(m, {comm, torch::kCPU, no_sp}, std::move(plan));
  ASSERT_EQ(parallel.graphs != nullptr, graphs);
  m->train();
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < kMicroSteps; ++micro) {
      const torch::Tensor mine = ids.narrow(0, 4 * comm.rank() + 2 * micro, 2);
      const model::LossSum loss = m->loss_sum(mine, mine.roll(-1, 1), /*fused=*/true);
      parallel.engine->backward(loss.mean(), {micro, kMicroSteps});
      if (comm.rank() == 0) run.losses.push_back(loss.mean().item<double>());
    }
    const zero::StepResult r = parallel.engine->step(0.5);
    if (comm.rank() == 0) run.norms.push_back(r.grad_norm());
    if (graphs) {
      const std::vector<size_t> agreed =
          agree_graph_fallbacks(comm, *parallel.graphs, parallel.graphs->take_fallbacks(),
                                m->blocks().size(), torch::kCPU);
      if (comm.rank() == 0) run.agreed.push_back(agreed);
    }
  }
  std::lock_guard<std::mutex> lock(mutex);
  for (auto& [key, master] : testing::masters(*parallel.engine, comm.rank())) {
    run.masters[key] = master;
  }
  if (graphs) run.eager_layers[comm.rank()] = parallel.graphs->stats().eager_layers;
  if (comm.rank() == 0) {
    if (graphs) run.stats = parallel.graphs->stats();
    run.layer_weight_bytes = model::storage_bytes(m->decoder_layer(0)->mlp->up_proj->weight);
  }
}

GraphsRun train_graphs(const GraphsSetup& s, bool graphs) {
  torch::manual_seed(7);  // drawn once, before the rank threads (they would race on it)
  const torch::Tensor ids = torch::randint(0, 97, {8, 12});
  GraphsRun run;
  std::mutex mutex;
  run_ranks(2, [&](ThreadCommunicator& comm) { train_rank(s, graphs, ids, comm, run, mutex); });
  return run;
}

void expect_identical_runs(const GraphsSetup& s) {
  const GraphsRun eager = train_graphs(s, false);
  const GraphsRun replayed = train_graphs(s, true);
  EXPECT_EQ(replayed.losses, eager.losses) << describe_graphs(s);
  EXPECT_EQ(replayed.norms, eager.norms) << describe_graphs(s);
  ASSERT_EQ(replayed.masters.size(), eager.masters.size()) << describe_graphs(s);
  for (const auto& [key, master] : eager.masters) {
    EXPECT_TRUE(torch::equal(master, replayed.masters.at(key))) << describe_graphs(s) << " " << key;
  }
  EXPECT_LT(eager.losses.back(), eager.losses.front()) << describe_graphs(s);
  const int layers = static_cast<int>(model::testing::small_config(s.model_type).num_hidden_layers);
  EXPECT_EQ(replayed.stats.recordings, layers * (s.checkpointing ? 3 : 2)) << describe_graphs(s);
  EXPECT_EQ(replayed.stats.eager_calls, 0) << describe_graphs(s);
  EXPECT_EQ(replayed.stats.failure, "") << describe_graphs(s);
  if (s.stage == 3) {
    EXPECT_EQ(eager.layer_weight_bytes, 0) << describe_graphs(s) << ": released after use";
    EXPECT_GT(replayed.layer_weight_bytes, 0) << describe_graphs(s) << ": kept for the graphs";
  }
}

TEST(LayerGraphsEngine, ReplayedStepsEqualEagerStepsAtEveryStage) {
  for (const int stage : {0, 1, 2, 3}) expect_identical_runs({"llama", torch::kFloat, stage});
  expect_identical_runs({"qwen2", torch::kBFloat16, 3});
  expect_identical_runs({"qwen2", torch::kBFloat16, 2, /*lora=*/true});
  expect_identical_runs({"qwen2", torch::kFloat, 3, /*lora=*/true, /*checkpointing=*/true});
  expect_identical_runs({"llama", torch::kBFloat16, 1, /*lora=*/false, /*checkpointing=*/true});
}

// A replay that differs from eager on rank 1 only: rank 1 runs that layer eagerly at once, the
// ranks agree after the step, and both run it eagerly from then on, with one warning from rank 0
// naming the layer, the rank and the difference; every loss, norm and update is eager's.
TEST(LayerGraphsEngine, APlantedReplayDifferenceFallsBackOnEveryRank) {
  for (const int stage : {0, 3}) {
    const GraphsSetup s{"llama", torch::kFloat, stage, false, false, /*perturbed_rank=*/1};
    const GraphsRun eager = train_graphs(s, false);
    ::testing::internal::CaptureStderr();
    const GraphsRun replayed = train_graphs(s, true);
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(replayed.losses, eager.losses) << describe_graphs(s);
    EXPECT_EQ(replayed.norms, eager.norms) << describe_graphs(s);
    for (const auto& [key, master] : eager.masters) {
      EXPECT_TRUE(torch::equal(master, replayed.masters.at(key))) << describe_graphs(s) << key;
    }
    ASSERT_EQ(replayed.agreed.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(replayed.agreed[0], std::vector<size_t>{2}) << "block 2 is model.layers.1";
    EXPECT_TRUE(replayed.agreed[1].empty());
    EXPECT_EQ(replayed.eager_layers, (std::vector<int64_t>{1, 1})) << describe_graphs(s);
    // Rank 0 replayed layer 1 in the first step only (its own check passed): 2 micro-steps.
    EXPECT_EQ(replayed.stats.eager_calls, (kSteps - 1) * kMicroSteps) << describe_graphs(s);
    const std::string line =
        "CUDA graphs: model.layers.1 runs eagerly on every rank from the next step: on rank(s) 1 "
        "its replay differed from the eager run: max |replay - eager|";
    const size_t at = err.find(line);
    EXPECT_NE(at, std::string::npos) << err;
    EXPECT_EQ(err.find("CUDA graphs:", at + 1), std::string::npos) << "warned more than once";
  }
}

// Replays that do not pay on rank 1 only (training.cuda_graphs: auto's rule, kAutoMinSpeedup:
// rank 0's replays time 10x faster than eager, rank 1's 2x slower): after the first step every
// layer runs eagerly on both ranks, with one line from rank 0 and no per-layer warning; every loss,
// norm and update is eager's.
TEST(LayerGraphsEngine, ReplaysThatDoNotPayOnOneRankTurnGraphsOffOnEveryRank) {
  GraphsSetup s{"llama", torch::kFloat, 1};
  s.slow_rank = 1;
  s.min_speedup = kAutoMinSpeedup;
  const GraphsRun eager = train_graphs(s, false);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  const GraphsRun replayed = train_graphs(s, true);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(replayed.losses, eager.losses);
  EXPECT_EQ(replayed.norms, eager.norms);
  for (const auto& [key, master] : eager.masters) {
    EXPECT_TRUE(torch::equal(master, replayed.masters.at(key))) << key;
  }
  ASSERT_EQ(replayed.agreed.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(replayed.agreed[0], (std::vector<size_t>{1, 2})) << "blocks 1 and 2: both layers";
  EXPECT_TRUE(replayed.agreed[1].empty());
  EXPECT_EQ(replayed.eager_layers, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(replayed.stats.eager_calls, (kSteps - 1) * kMicroSteps * 2) << "rank 0, 2 layers";
  const std::string line =
      "CUDA graphs off from the next step: on rank(s) 1 the layers' replays took 4e+03 ms, over "
      "the "
      "1.6e+03 ms that would pay";
  const size_t at = out.find(line);
  EXPECT_NE(at, std::string::npos) << out;
  EXPECT_EQ(out.find("CUDA graphs", at + 1), std::string::npos) << "said more than once:\n" << out;
  EXPECT_EQ(err.find("CUDA graphs"), std::string::npos) << "no warning:\n" << err;
}

// What graphs_choice.h keeps graphs off for, parallelize() refuses outright.
TEST(LayerGraphsEngine, ParallelizeRefusesGraphsWhereALayerCannotBeReplayed) {
  run_ranks(1, [&](ThreadCommunicator& comm) {
    model::DecoderModel m(model::testing::small_config("llama"), model::Materialize::kNo);
    ParallelPlan plan;
    plan.graph_recorder = model::replaying_recorder();
    plan.checkpointing = model::Checkpointing::kOffload;
    plan.optimizer = sgd();
    plan.initial_values = model::init_source(*m, 3);
    SequenceParallel no_sp(nullptr);
    try {
      (void)parallelize(m, {comm, torch::kCPU, no_sp}, std::move(plan));
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal);
      EXPECT_NE(std::string(e.what()).find("offloaded checkpointing"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace dstrain::train
