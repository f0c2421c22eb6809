// Pipeline parallelism (train/pipeline.h): the schedules' orders, checked by running them on a
// simulated pipeline (every rank's actions in order, each waiting for what it receives) for
// completion and for the bubble the formula gives; the stage split; and a step through P = 2, 3
// and 4 ranks as threads against one process running the whole model on the same micro-batches,
// under every schedule, with tied and untied embeddings.

#include "train/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "estimate/activations.h"
#include "model/storage.h"
#include "optim/optimizer.h"
#include "tests/common/expect_error.h"
#include "tests/common/thread_communicator.h"
#include "tests/unit/estimate/small_model.h"
#include "tests/unit/model/counting_allocator.h"
#include "train/phase_peaks.h"

namespace dstrain::train {
namespace {

using dstrain::testing::PointToPoint;
using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;

struct ScheduleCase {
  PipelineSchedule schedule;
  int stages, micro_batches, chunks;
};

std::string name_of(const ScheduleCase& c) {
  return fmt::format("{} P{} m{} v{}", schedule_word(c.schedule), c.stages, c.micro_batches,
                     c.chunks);
}

std::vector<ScheduleCase> schedule_cases() {
  std::vector<ScheduleCase> out;
  for (int p = 1; p <= 4; ++p) {
    for (int m : {1, 2, 3, 4, 8, 12}) {
      out.push_back({PipelineSchedule::kGpipe, p, m, 1});
      out.push_back({PipelineSchedule::kOneForwardOneBackward, p, m, 1});
      if (m % p == 0) {
        for (int v : {1, 2, 3}) out.push_back({PipelineSchedule::kInterleaved, p, m, v});
      }
    }
  }
  return out;
}

// Every rank's actions run in order, one time unit each; a forward of virtual stage s waits for
// the forward of s − 1 (same micro-batch) to have ended, a backward of s for the backward of s + 1
// and for its own forward. Returns the time the last action ends (0: a deadlock) and the busy
// units.
struct Simulated {
  int makespan = 0;
  int busy = 0;
};

Simulated simulate(const ScheduleCase& c) {
  const int P = c.stages, V = c.stages * c.chunks;
  std::vector<std::vector<PipelineAction>> actions;
  for (int p = 0; p < P; ++p) {
    actions.push_back(pipeline_schedule(c.schedule, P, p, c.micro_batches, c.chunks, "key"));
  }
  // End times by (forward, virtual stage, micro-batch).
  std::map<std::tuple<bool, int, int>, int> ended;
  std::vector<size_t> next(P, 0);
  std::vector<int> free_at(P, 0);
  Simulated out;
  for (bool progress = true; progress;) {
    progress = false;
    for (int p = 0; p < P; ++p) {
      if (next[p] == actions[p].size()) continue;
      const PipelineAction& a = actions[p][next[p]];
      const int s = a.chunk * P + p;
      int ready = free_at[p];
      auto need = [&](bool forward, int stage) {
        const auto it = ended.find({forward, stage, a.micro_batch});
        if (it == ended.end()) return false;
        ready = std::max(ready, it->second);
        return true;
      };
      bool can = true;
      if (a.forward && s > 0) can = need(true, s - 1);
      if (!a.forward) can = need(true, s) && (s == V - 1 || need(false, s + 1));
      if (!can) continue;
      ended[{a.forward, s, a.micro_batch}] = ready + 1;
      free_at[p] = ready + 1;
      out.makespan = std::max(out.makespan, ready + 1);
      ++out.busy;
      ++next[p];
      progress = true;
    }
  }
  for (int p = 0; p < P; ++p) {
    if (next[p] != actions[p].size()) return {};
  }
  return out;
}

TEST(PipelineSchedule, EveryRankRunsEachForwardThenItsBackwardOnce) {
  for (const ScheduleCase& c : schedule_cases()) {
    for (int p = 0; p < c.stages; ++p) {
      const auto actions =
          pipeline_schedule(c.schedule, c.stages, p, c.micro_batches, c.chunks, "key");
      std::set<std::pair<int, int>> forwards, backwards;
      int held = 0, most = 0;
      for (const PipelineAction& a : actions) {
        const std::pair<int, int> id{a.micro_batch, a.chunk};
        if (a.forward) {
          EXPECT_TRUE(forwards.insert(id).second) << name_of(c) << " rank " << p;
          most = std::max(most, ++held);
        } else {
          EXPECT_TRUE(forwards.count(id)) << name_of(c) << ": backward before forward";
          EXPECT_TRUE(backwards.insert(id).second) << name_of(c) << " rank " << p;
          --held;
        }
      }
      EXPECT_EQ(forwards.size(), static_cast<size_t>(c.micro_batches * c.chunks)) << name_of(c);
      EXPECT_EQ(backwards.size(), forwards.size()) << name_of(c);
      // What bounds the activations a rank holds: all of them under GPipe, P − p under 1F1B.
      if (c.schedule == PipelineSchedule::kGpipe) {
        EXPECT_EQ(most, c.micro_batches) << name_of(c);
      }
      if (c.schedule == PipelineSchedule::kOneForwardOneBackward) {
        EXPECT_EQ(most, std::min(c.micro_batches, c.stages - p)) << name_of(c) << " rank " << p;
      }
    }
  }
}

// On the simulated pipeline every schedule completes, and the idle share of the step is the
// formula's: (P − 1)/(m + P − 1), interleaved (P − 1)/(v·m + P − 1) with each chunk's action
// taking 1/v of a stage's.
TEST(PipelineSchedule, SimulatedPipelineCompletesWithTheFormulasBubble) {
  for (const ScheduleCase& c : schedule_cases()) {
    const Simulated got = simulate(c);
    ASSERT_GT(got.makespan, 0) << name_of(c) << ": deadlock";
    const double idle = 1.0 - static_cast<double>(got.busy) / (c.stages * got.makespan);
    EXPECT_NEAR(idle, pipeline_bubble(c.stages, c.micro_batches, c.chunks), 1e-12) << name_of(c);
  }
}

TEST(PipelineSchedule, InterleavingNeedsAMultipleOfTheStages) {
  dstrain::testing::expect_error(
      [] {
        pipeline_schedule(PipelineSchedule::kInterleaved, 4, 0, 6, 2,
                          "training.gradient_accumulation_steps");
      },
      ErrorKind::kConfig,
      {"training.gradient_accumulation_steps is 6: interleaved pipeline schedules need a multiple "
       "of the 4 pipeline stages"});
}

TEST(PipelineStages, BalanceMinimisesTheLargestStage) {
  // Embedding (free), four equal layers, a head as costly as two layers.
  const std::vector<double> costs{0, 1, 1, 1, 1, 2};
  EXPECT_EQ(balance_stages(costs, 1, "k"), (StageRanges{{0, 6}}));
  EXPECT_EQ(balance_stages(costs, 2, "k"), (StageRanges{{0, 4}, {4, 6}}));
  EXPECT_EQ(balance_stages(costs, 3, "k"), (StageRanges{{0, 3}, {3, 5}, {5, 6}}));
  // Equal blocks that do not divide: the earlier stages are the smaller.
  EXPECT_EQ(balance_stages({1, 1, 1, 1, 1}, 2, "k"), (StageRanges{{0, 2}, {2, 5}}));
  dstrain::testing::expect_error(
      [] {
        balance_stages({1, 1, 1}, 4, "parallel.x");
      },
      ErrorKind::kConfig, {"parallel.x: 4 pipeline stages for a model of 3 blocks"});
}

nlohmann::json llama(bool tied) {
  return {{"model_type", "llama"},    {"vocab_size", 96},
          {"hidden_size", 32},        {"intermediate_size", 48},
          {"num_hidden_layers", 4},   {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-6},     {"tie_word_embeddings", tied}};
}

TEST(PipelineStages, BlockCostsAreTheMatricesMultiplyAdds) {
  model::DecoderModel m(model::parse_model_config(llama(false)), model::Materialize::kNo);
  const std::vector<double> costs = block_costs(*m);
  ASSERT_EQ(costs.size(), 6u);
  EXPECT_EQ(costs[0], 0);
  // q 32·32, k and v 16·32 each, o 32·32, gate and up and down 48·32.
  EXPECT_EQ(costs[1], 32 * 32 * 2 + 16 * 32 * 2 + 48 * 32 * 3);
  EXPECT_EQ(costs[5], 96 * 32);
  model::DecoderModel tied(model::parse_model_config(llama(true)), model::Materialize::kNo);
  EXPECT_EQ(block_costs(*tied)[5], 96 * 32) << "the tied head reads the embedding's matrix";
}

// parallel.pipeline_split: layer counts per stage, the embedding on the first and the head on the
// last; rank_blocks: a rank's virtual stages p, p + P, ...
TEST(PipelineStages, SplitByLayerCountsAndEachRanksBlocks) {
  model::DecoderModel m(model::parse_model_config(llama(false)), model::Materialize::kNo);
  EXPECT_EQ(split_stages({1, 3}, *m, "k"), (StageRanges{{0, 2}, {2, 6}}));
  EXPECT_EQ(split_stages({1, 1, 1, 1}, *m, "k"), (StageRanges{{0, 2}, {2, 3}, {3, 4}, {4, 6}}));
  dstrain::testing::expect_error(
      [&] {
        split_stages({2, 3}, *m, "cfg.yaml: parallel.split");
      },
      ErrorKind::kConfig,
      {"cfg.yaml: parallel.split: the stages' layer counts add up to "
       "5, but the model has 4 layers"});
  const StageRanges four{{0, 2}, {2, 3}, {3, 4}, {4, 6}};
  EXPECT_EQ(rank_blocks(four, 2, 0), (std::vector<size_t>{0, 1, 3}));
  EXPECT_EQ(rank_blocks(four, 2, 1), (std::vector<size_t>{2, 4, 5}));
  EXPECT_EQ(rank_blocks(four, 4, 3), (std::vector<size_t>{4, 5}));
}

struct StepCase {
  std::string name;
  PipelineSchedule schedule;
  int ranks, chunks;
  bool tied;
};

constexpr int kMicroBatches = 4;

std::vector<PipelineStage::MicroBatch> micro_batches(int64_t vocab, int count = kMicroBatches) {
  torch::manual_seed(7);
  std::vector<PipelineStage::MicroBatch> out;
  for (int i = 0; i < count; ++i) {
    const torch::Tensor ids = torch::randint(0, vocab, {2, 13}, torch::kInt64);
    torch::Tensor labels = ids.roll(-1, 1).clone();
    labels.index_put_({0, 0}, model::kIgnoreIndex);
    out.push_back({ids, labels, {}});
  }
  return out;
}

// ‖got − want‖ / ‖want‖.
double relative(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).to(torch::kDouble).norm().item<double>() /
         std::max(1e-30, want.to(torch::kDouble).norm().item<double>());
}

class PipelineStep : public ::testing::TestWithParam<StepCase> {};

// The loss and every gradient of a step through the pipeline, and the loss of an evaluation through
// it, equal one process's sequential run of the same micro-batches (the same blocks on the same
// inputs, the gradients accumulated in the same micro-batch order): bit for bit but the tied
// embedding's, whose two parts are added once at the end instead of micro-batch by micro-batch.
TEST_P(PipelineStep, LossAndGradientsEqualOneProcess) {
  const StepCase c = GetParam();
  const model::ModelConfig config = model::parse_model_config(llama(c.tied));
  // Interleaving takes the micro-batches P at a time.
  const auto batches =
      micro_batches(config.vocab_size, kMicroBatches % c.ranks == 0 ? kMicroBatches : 2 * c.ranks);
  model::DecoderModel whole = model::build_model(config, torch::kFloat32, 3);
  double count = 0;
  for (const auto& mb : batches) count += mb.labels.ne(model::kIgnoreIndex).sum().item<double>();
  double want_loss = 0;
  for (const auto& mb : batches) {
    const model::LossSum l = whole->loss_sum(mb.input_ids, mb.labels, /*fused=*/true);
    want_loss += l.sum.item<double>();
    (l.sum / count).backward();
  }
  std::map<std::string, torch::Tensor> want;
  for (const auto& item : whole->named_parameters()) want[item.key()] = item.value().grad();

  // Both ways of moving the transfers: buffered (as Gloo may), and a rendezvous where each batch of
  // a rank's transfers must complete before its next (NCCL's, on one stream): a schedule whose
  // sends and receives are not batched as its peers' are hangs there.
  for (const PointToPoint transfers : {PointToPoint::kBuffered, PointToPoint::kRendezvous}) {
    SCOPED_TRACE(transfers == PointToPoint::kBuffered ? "buffered" : "rendezvous");
    run_ranks(
        c.ranks,
        [&](ThreadCommunicator& group) {
          model::DecoderModel m = model::build_model(config, torch::kFloat32, 3);
          const StageRanges stages = balance_stages(block_costs(*m), c.ranks * c.chunks,
                                                    "parallel.pipeline_parallel_size");
          PipelineStage stage(*m, &group, stages, {c.schedule});
          const model::LossSum got = stage.run(
              batches, [&](const model::LossSum& l) { return l.sum * (1.0 / count); }, "key");
          const std::string at = fmt::format("rank {}", group.rank());
          // Evaluation through the same stages: the same losses, without gradients.
          const model::LossSum evaluated = stage.evaluate(batches);
          if (group.rank() == (c.ranks * c.chunks - 1) % c.ranks) {
            EXPECT_NEAR(got.sum.item<double>(), want_loss, 1e-6 * std::abs(want_loss)) << at;
            EXPECT_EQ(got.count.item<double>(), count) << at;
            EXPECT_NEAR(evaluated.sum.item<double>(), want_loss, 1e-6 * std::abs(want_loss)) << at;
            EXPECT_FALSE(evaluated.sum.requires_grad()) << at;
          }
          std::set<std::string> mine;
          for (size_t b : stage.blocks()) {
            for (const auto& p : m->blocks()[b]->parameters) mine.insert(p.name);
          }
          if (c.tied && (group.rank() == 0 || group.rank() == (c.ranks * c.chunks - 1) % c.ranks)) {
            mine.insert("model.embed_tokens.weight");
          }
          for (const auto& item : m->named_parameters()) {
            const std::string& name = item.key();
            const torch::Tensor& g = item.value().grad();
            if (!mine.count(name)) {
              EXPECT_FALSE(g.defined() && g.abs().max().item<double>() > 0)
                  << name << " is not this rank's but got a gradient, " << at;
              continue;
            }
            ASSERT_TRUE(g.defined()) << name << ", " << at;
            if (c.tied && name == "model.embed_tokens.weight") {
              EXPECT_LT(relative(g, want.at(name)), 1e-6) << name << ", " << at;
            } else {
              EXPECT_TRUE(torch::equal(g, want.at(name)))
                  << name << ", " << at << ": relative difference " << relative(g, want.at(name));
            }
          }
        },
        transfers);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Schedules, PipelineStep,
    ::testing::Values(
        StepCase{"OneF1BP2", PipelineSchedule::kOneForwardOneBackward, 2, 1, false},
        StepCase{"OneF1BP2Tied", PipelineSchedule::kOneForwardOneBackward, 2, 1, true},
        StepCase{"OneF1BP3", PipelineSchedule::kOneForwardOneBackward, 3, 1, false},
        StepCase{"OneF1BP4Tied", PipelineSchedule::kOneForwardOneBackward, 4, 1, true},
        StepCase{"GpipeP2", PipelineSchedule::kGpipe, 2, 1, false},
        StepCase{"InterleavedP2V2", PipelineSchedule::kInterleaved, 2, 2, false},
        StepCase{"InterleavedP2V3Tied", PipelineSchedule::kInterleaved, 2, 3, true},
        StepCase{"InterleavedP3V2", PipelineSchedule::kInterleaved, 3, 2, false},
        StepCase{"InterleavedP4V1", PipelineSchedule::kInterleaved, 4, 1, false}),
    [](const ::testing::TestParamInfo<StepCase>& i) { return i.param.name; });

// A stage before the last keeps nothing of what it sent on but its autograd edge (Megatron-LM's
// deallocate_output_tensor): under GPipe the first stage (the embedding alone, which saves only the
// ids) runs all 8 forwards before any backward. At its fullest it holds the hidden states it
// computes and the copies the test's communicator makes of its sends until the receiver frees them
// (measured: 2.0 or 3.0 micro-batches' worth, by the threads' timing; 8.3 when the stage kept what
// it sent).
TEST(PipelineMemory, AStageFreesWhatItSentOn) {
  using Counter = model::testing::CountingAllocator;
  model::testing::CountingScope scope;
  const model::ModelConfig config = model::parse_model_config(llama(false));
  const auto batches = micro_batches(config.vocab_size, 8);
  const auto hidden_bytes = static_cast<double>(batches[0].input_ids.numel() * 32 * 4);
  run_ranks(
      2,
      [&](ThreadCommunicator& group) {
        model::DecoderModel m = model::build_model(config, torch::kFloat32, 3);
        const int64_t start = Counter::thread_current();
        Counter::reset_thread_peak();
        PhasePeaks peaks([start] {
          const int64_t peak = Counter::thread_peak() - start;
          Counter::reset_thread_peak();
          return peak;
        });
        StageOptions options{PipelineSchedule::kGpipe};
        options.peaks = &peaks;
        PipelineStage stage(*m, &group, {{0, 1}, {1, m->blocks().size()}}, options);
        stage.run(
            batches, [](const model::LossSum& l) { return l.sum * 1e-2; }, "key");
        if (group.rank() != 0) return;
        double forward = -1;
        for (const auto& [name, mb] : peaks.take_metrics()) {
          if (name == "memory/peak_allocated_mb/forward") forward = mb * 1e6;
        }
        EXPECT_GT(forward, 0);
        EXPECT_LT(forward, 4 * hidden_bytes)
            << "the first stage's fullest forward holds " << forward / hidden_bytes
            << " micro-batches' hidden states";
        // Its backward ran from the freed output's autograd edge.
        EXPECT_TRUE(m->blocks()[0]->parameters[0].tensor.grad().defined());
      },
      PointToPoint::kRendezvous);
}

// Each pipeline rank's peak over a step (the activations its schedule keeps in flight, its
// blocks' gradients made beforehand) against the memory model's prediction for that rank
// (estimate/activations.h: its chunks, in_flight_chunks of its schedule), within the 6% of the
// whole model's test (tests/unit/estimate/activations_test.cpp): 1F1B holds P − p micro-batches
// on stage p, GPipe all of them, and GPipe's last stage keeps every micro-batch's fused-loss
// weight-gradient buffer too.
TEST(PipelineMemory, EachStagesPeakMatchesItsMemoryPlan) {
  torch::set_num_threads(1);
  using Counter = model::testing::CountingAllocator;
  model::testing::CountingScope scope;
  const model::ModelConfig config = estimate::testing::small_model();
  constexpr int kMicro = 4;
  constexpr int64_t kChunkBytes = int64_t{1} << 20;
  torch::manual_seed(3);
  std::vector<PipelineStage::MicroBatch> batches;
  for (int i = 0; i < kMicro; ++i) {
    const torch::Tensor ids = torch::randint(0, 2048, {2, 256}, torch::kInt64);
    batches.push_back({ids, ids.roll(-1, 1), {}});
  }
  for (const PipelineSchedule schedule :
       {PipelineSchedule::kOneForwardOneBackward, PipelineSchedule::kGpipe}) {
    SCOPED_TRACE(schedule_word(schedule));
    std::vector<double> measured(2), predicted(2);
    run_ranks(
        2,
        [&](ThreadCommunicator& group) {
          model::DecoderModel m = model::build_model(config, torch::kFloat32, 1);
          m->set_loss_chunk_bytes(kChunkBytes);
          const StageRanges stages =
              balance_stages(block_costs(*m), 2, "parallel.pipeline_parallel_size");
          PipelineStage stage(*m, &group, stages, {schedule});
          const auto loss = [](const model::LossSum& l) { return l.sum * 1e-3; };
          stage.run(batches, loss, "key");  // the gradients exist from here on
          Counter::start_thread_count();
          stage.run(batches, loss, "key");
          const int p = group.rank();
          measured[static_cast<size_t>(p)] = static_cast<double>(Counter::thread_since_peak());
          estimate::ActivationInput in;
          in.model = model::DecoderModel(config, model::Materialize::kNo);
          in.micro_batch = 2;
          in.seq_len = 256;
          in.loss_chunk_bytes = kChunkBytes;
          in.chunks = {stages[static_cast<size_t>(p)]};
          in.in_flight = in_flight_chunks(pipeline_schedule(schedule, 2, p, kMicro, 1, "key"));
          predicted[static_cast<size_t>(p)] =
              static_cast<double>(estimate::activation_row(in, model::Checkpointing::kNone).device);
        },
        PointToPoint::kRendezvous);
    for (size_t p = 0; p < 2; ++p) {
      std::cout << schedule_word(schedule) << " stage " << p << ": peak " << measured[p]
                << " bytes, predicted " << predicted[p] << " ("
                << fmt::format("{:+.1f}%", 100.0 * (predicted[p] - measured[p]) / measured[p])
                << ")\n";
      EXPECT_NEAR(measured[p], predicted[p], 0.06 * predicted[p]) << "stage " << p;
    }
  }
}

// The in-flight counts of the schedules are the formulas': 1F1B min(m, P − p), GPipe m,
// interleaved min(m·v, 2(P − p − 1) + (v − 1)·P + 1) chunks.
TEST(PipelineMemory, InFlightChunksFollowTheFormulas) {
  for (int P = 1; P <= 4; ++P) {
    for (int p = 0; p < P; ++p) {
      for (int m : {1, 2, 4, 8, 12}) {
        EXPECT_EQ(in_flight_chunks(
                      pipeline_schedule(PipelineSchedule::kOneForwardOneBackward, P, p, m, 1, "k")),
                  std::min(m, P - p));
        EXPECT_EQ(in_flight_chunks(pipeline_schedule(PipelineSchedule::kGpipe, P, p, m, 1, "k")),
                  m);
        if (m % P != 0) continue;
        for (int v : {2, 3}) {
          EXPECT_EQ(
              in_flight_chunks(pipeline_schedule(PipelineSchedule::kInterleaved, P, p, m, v, "k")),
              std::min(m * v, 2 * (P - p - 1) + (v - 1) * P + 1))
              << "P " << P << " p " << p << " m " << m << " v " << v;
        }
      }
    }
  }
}

// Plain SGD at learning rate 1: a step moves each parameter by minus its gradient, so the update
// shows the gradient itself (AdamW's first step would show only its sign).
std::unique_ptr<zero::Engine> engine_over(std::vector<zero::NamedParameter> params,
                                          comm::Communicator& comm, int stage,
                                          comm::Communicator* world = nullptr) {
  zero::EngineOptions options;
  options.stage = stage;
  options.model_parallel.world = world;
  options.reduce_bucket_size = 4096;  // several buckets a stage
  return zero::make_engine(
      std::move(params), comm,
      [](int64_t numel, std::vector<optim::Range>) {
        return optim::make_sgd(numel, optim::SgdOptions{});
      },
      options);
}

constexpr double kLr = 1.0;

struct EngineCase {
  std::string name;
  PipelineSchedule schedule;
  int ranks, chunks, zero_stage;
  bool tied = false;
};

class PipelineEngineStep : public ::testing::TestWithParam<EngineCase> {};

// Each rank's ZeRO engine over its stages' parameters only (a data-parallel group of one), its
// micro-steps the pipeline's backwards: one optimizer step moves every parameter as one process's
// engine stepping the whole model over the same micro-batches does (the update, which is the
// gradient here, within 1e-6), every stage's engine reports the whole model's gradient norm (its
// Σg² summed over the pipeline), and the last stage's scaled loss is the step's loss. Tied: the
// head's rank holds the embedding outside its engine, the first stage's engine adds the head's
// gradient, and after sync_tied() both ranks hold the one update.
TEST_P(PipelineEngineStep, ParametersAfterAStepEqualOneProcess) {
  const EngineCase c = GetParam();
  const model::ModelConfig config = model::parse_model_config(llama(c.tied));
  const auto batches = micro_batches(config.vocab_size);
  double count = 0;
  for (const auto& mb : batches) count += mb.labels.ne(model::kIgnoreIndex).sum().item<double>();
  std::map<std::string, torch::Tensor> want;  // each parameter's update
  double want_norm = 0, want_loss = 0;
  run_ranks(1, [&](ThreadCommunicator& solo) {
    model::DecoderModel whole = model::build_model(config, torch::kFloat32, 3);
    std::vector<zero::NamedParameter> params;
    for (const auto& item : whole->named_parameters()) {
      params.push_back({item.key(), item.value()});
      want[item.key()] = item.value().detach().clone();
    }
    auto engine = engine_over(params, solo, c.zero_stage);
    for (int i = 0; i < kMicroBatches; ++i) {
      const auto& mb = batches[static_cast<size_t>(i)];
      const model::LossSum l = whole->loss_sum(mb.input_ids, mb.labels, /*fused=*/true);
      want_loss += l.sum.item<double>() / count;
      engine->backward(l.sum * (kMicroBatches / count), {i, kMicroBatches});
    }
    want_norm = engine->step(kLr).grad_norm();
    for (const auto& item : whole->named_parameters()) {
      want[item.key()] = item.value().detach() - want[item.key()];
    }
  });
  for (const PointToPoint transfers : {PointToPoint::kBuffered, PointToPoint::kRendezvous}) {
    SCOPED_TRACE(transfers == PointToPoint::kBuffered ? "buffered" : "rendezvous");
    run_ranks(
        c.ranks,
        [&](ThreadCommunicator& group) {
          model::DecoderModel m = model::build_model(config, torch::kFloat32, 3);
          const StageRanges stages = balance_stages(block_costs(*m), c.ranks * c.chunks, "key");
          // The blocks this rank runs, as PipelineStage will say; every rank alone in its
          // data-parallel group.
          std::set<size_t> mine;
          for (int ch = 0; ch < c.chunks; ++ch) {
            const auto [first, last] = stages[static_cast<size_t>(ch * c.ranks + group.rank())];
            for (size_t b = first; b < last; ++b) mine.insert(b);
          }
          std::vector<zero::NamedParameter> params;
          for (const auto& item : m->named_parameters()) {
            for (size_t b : mine) {
              for (const auto& p : m->blocks()[b]->parameters) {
                if (p.name == item.key()) params.push_back({item.key(), item.value()});
              }
            }
          }
          std::map<std::string, torch::Tensor> before;
          for (const zero::NamedParameter& p : params) before[p.name] = p.tensor.detach().clone();
          const std::unique_ptr<comm::Communicator> data_parallel = group.split(group.rank());
          auto engine = engine_over(params, *data_parallel, c.zero_stage, &group);
          PipelineStage stage(*m, &group, stages, {c.schedule, engine.get()});
          const bool head_rank = group.rank() == c.ranks - 1;
          const torch::Tensor embedding_before = m->head_weight().detach().clone();
          stage.sync_tied();
          // The engine divides each micro-step's loss by its micro-steps.
          const double micro_steps = kMicroBatches * c.chunks;
          stage.run(
              batches, [&](const model::LossSum& l) { return l.sum * (micro_steps / count); },
              "key");
          const double norm = engine->step(kLr).grad_norm();
          stage.sync_tied();
          EXPECT_NEAR(norm, want_norm, 1e-6 * want_norm) << "rank " << group.rank();
          if (head_rank) {
            EXPECT_NEAR(stage.step_loss().item<double>(), want_loss, 1e-6 * want_loss);
          } else {
            EXPECT_EQ(stage.step_loss().item<double>(), 0);
          }
          for (const zero::NamedParameter& p : params) {
            const torch::Tensor update = p.tensor.detach() - before.at(p.name);
            EXPECT_GT(update.abs().max().item<double>(), 0) << p.name << " did not move";
            EXPECT_LT(relative(update, want.at(p.name)), 1e-6)
                << p.name << ", rank " << group.rank();
          }
          if (c.tied && head_rank) {
            const torch::Tensor update = m->head_weight().detach() - embedding_before;
            EXPECT_LT(relative(update, want.at("model.embed_tokens.weight")), 1e-6)
                << "the head's copy of the tied embedding";
          }
        },
        transfers);
  }
}

// A pipeline of one stage runs a step in parts (StepPart: the trial step of micro-batch auto votes
// between them): the micro-batches in two calls update the parameters as the one call does, bit
// for bit; a part of a two-stage pipeline's step is refused.
TEST(PipelineEngineStep, AStepInPartsIsTheWholeStep) {
  const model::ModelConfig config = model::parse_model_config(llama(false));
  const auto batches = micro_batches(config.vocab_size);
  const auto loss = [](const model::LossSum& l) { return l.sum * 0.01; };
  std::vector<std::map<std::string, torch::Tensor>> after;
  for (const bool in_parts : {false, true}) {
    run_ranks(1, [&](ThreadCommunicator& solo) {
      model::DecoderModel m = model::build_model(config, torch::kFloat32, 3);
      std::vector<zero::NamedParameter> params;
      for (const auto& item : m->named_parameters()) params.push_back({item.key(), item.value()});
      auto engine = engine_over(params, solo, 1);
      PipelineStage stage(*m, nullptr, {{0, m->blocks().size()}}, {{}, engine.get()});
      if (in_parts) {
        const auto half = batches.begin() + kMicroBatches / 2;
        stage.run({batches.begin(), half}, loss, "key", {0, kMicroBatches});
        stage.run({half, batches.end()}, loss, "key", {kMicroBatches / 2, kMicroBatches});
      } else {
        stage.run(batches, loss, "key");
      }
      engine->step(kLr);
      std::map<std::string, torch::Tensor> values;
      for (const auto& item : m->named_parameters())
        values[item.key()] = item.value().detach().clone();
      after.push_back(values);
    });
  }
  for (const auto& [name, value] : after[0]) {
    EXPECT_TRUE(torch::equal(after[1].at(name), value)) << name;
  }
  run_ranks(2, [&](ThreadCommunicator& group) {
    model::DecoderModel m = model::build_model(config, torch::kFloat32, 3);
    const StageRanges stages = balance_stages(block_costs(*m), 2, "key");
    PipelineStage stage(*m, &group, stages, {});
    dstrain::testing::expect_error(
        [&] {
          stage.run({batches[0]}, loss, "key", {0, 2});
        },
        ErrorKind::kInternal, {"of 2 on a pipeline of 2 stages"});
  });
}

// The head's rank of a tied model holds what tied_copy_bytes says beside its engine (the run plan
// adds it to that rank's model states): the matrix's copy (made by sync_tied) and the float32 sum
// of its gradient over the step, measured as the head's rank's peak over a step with an engine
// against the same model untied (whose head matrix is in the engine, its gradient buffer made
// before).
TEST(PipelineMemory, TheHeadsRankHoldsWhatTiedCopyBytesSays) {
  torch::set_num_threads(1);
  using Counter = model::testing::CountingAllocator;
  model::testing::CountingScope scope;
  std::vector<double> peak(2);
  int64_t predicted = 0;
  // A vocabulary large enough that the matrix (1 MiB) dwarfs the step's small allocations.
  const auto with_vocabulary = [](nlohmann::json c) {
    c["vocab_size"] = 8192;
    return model::parse_model_config(c);
  };
  for (const bool tied : {false, true}) {
    const model::ModelConfig config = with_vocabulary(llama(tied));
    const auto batches = micro_batches(config.vocab_size);
    run_ranks(2, [&](ThreadCommunicator& group) {
      model::DecoderModel m = model::build_model(config, torch::kFloat32, 3);
      const StageRanges stages = balance_stages(block_costs(*m), 2, "key");
      std::vector<zero::NamedParameter> params;
      for (size_t b : rank_blocks(stages, 2, group.rank())) {
        for (const auto& p : m->blocks()[b]->parameters) {
          if (!tied || b + 1 < m->blocks().size() || p.name != "model.embed_tokens.weight")
            params.push_back({p.name, p.tensor});
        }
      }
      const std::unique_ptr<comm::Communicator> data_parallel = group.split(group.rank());
      auto engine = engine_over(params, *data_parallel, 0, &group);
      PipelineStage stage(*m, &group, stages,
                          {PipelineSchedule::kOneForwardOneBackward, engine.get()});
      // As a run builds it: the head's rank's copy holds no memory until sync_tied().
      if (group.rank() == 1 && tied) {
        const torch::Tensor& w = m->head_weight();
        w.set_data(model::unmaterialized(w.sizes(), torch::kFloat));
      }
      Counter::start_thread_count();
      stage.sync_tied();
      stage.run(
          batches, [](const model::LossSum& l) { return l.sum * 1e-3; }, "key");
      if (group.rank() != 1) return;
      peak[tied ? 1 : 0] = static_cast<double>(Counter::thread_since_peak());
      if (tied) predicted = tied_copy_bytes(*m, stages, 2, 1, 4, /*head_trains=*/true);
    });
  }
  const model::ModelConfig config = with_vocabulary(llama(true));
  EXPECT_EQ(predicted, config.vocab_size * config.hidden_size * 8);
  std::cout << "the head's rank's peak over a step: untied " << peak[0] << " bytes, tied "
            << peak[1] << ", predicted difference " << predicted << "\n";
  EXPECT_NEAR(peak[1] - peak[0], static_cast<double>(predicted), 0.02 * predicted);
}

INSTANTIATE_TEST_SUITE_P(
    Stages, PipelineEngineStep,
    ::testing::Values(
        EngineCase{"OneF1BP2Zero0", PipelineSchedule::kOneForwardOneBackward, 2, 1, 0},
        EngineCase{"OneF1BP2Zero1", PipelineSchedule::kOneForwardOneBackward, 2, 1, 1},
        EngineCase{"OneF1BP3Zero2", PipelineSchedule::kOneForwardOneBackward, 3, 1, 2},
        EngineCase{"InterleavedP2V2Zero1", PipelineSchedule::kInterleaved, 2, 2, 1},
        EngineCase{"OneF1BP2Zero1Tied", PipelineSchedule::kOneForwardOneBackward, 2, 1, 1, true},
        EngineCase{"OneF1BP3Zero2Tied", PipelineSchedule::kOneForwardOneBackward, 3, 1, 2, true},
        EngineCase{"InterleavedP2V2Zero0Tied", PipelineSchedule::kInterleaved, 2, 2, 0, true}),
    [](const ::testing::TestParamInfo<EngineCase>& i) { return i.param.name; });

}  // namespace
}  // namespace dstrain::train
