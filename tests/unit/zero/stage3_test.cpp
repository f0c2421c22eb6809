// ZeRO stage 3: equivalence with stage 0 at world sizes 1–4, memory and communication against the
// formulas, offload, and re-shardable checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/unit/zero/stage3_fixtures.h"

namespace dstrain::zero::testing {
namespace {

struct Case {
  int world;
  int accum;
  double clip;
  bool tied = true;
  int64_t persistence = 0;  // stage3_param_persistence_threshold
  int64_t prefetch = 1000;  // stage3_prefetch_bucket_size
  bool offload = false;     // offload_optimizer and offload_param
};

std::string name_of(const Case& c) {
  return fmt::format("world{}_accum{}{}{}{}{}{}", c.world, c.accum, c.clip > 0 ? "_clip" : "",
                     c.tied ? "_tied" : "_untied",
                     c.persistence ? fmt::format("_persist{}", c.persistence) : "",
                     c.prefetch ? "" : "_noprefetch", c.offload ? "_offload" : "");
}

void expect_close(double a, double b, double rtol, const std::string& what) {
  EXPECT_LE(std::abs(a - b), rtol * std::max(std::abs(b), 1e-3))
      << what << ": " << a << " vs " << b;
}

StackRun stage_run(int stage, int world, int accum, double clip) {
  StackRun run;
  run.world = world;
  run.options.stage = stage;
  run.accum = accum;
  run.options.gradient_clipping = clip;
  run.options.reduce_bucket_size = 40;
  return run;
}

class Stage3MatchesStage0 : public ::testing::TestWithParam<Case> {};

TEST_P(Stage3MatchesStage0, LossesGradNormsAndMasterWeightsOver20Steps) {
  const Case c = GetParam();
  torch::set_num_threads(1);
  StackShape shape;
  shape.tied = c.tied;
  const StackProblem problem = make_stack_problem(shape);
  StackRun run = stage_run(3, c.world, c.accum, c.clip);
  run.options.param_persistence_threshold = c.persistence;
  run.options.prefetch_bucket_size = c.prefetch;
  run.options.offload_optimizer = c.offload;
  run.options.offload_param = c.offload;
  const StackResult got = run_stack(problem, run);
  const StackResult want = run_stack(problem, stage_run(0, 1, 1, c.clip));
  int clipped = 0;
  for (int s = 0; s < 20; ++s) {
    expect_close(got.losses[s], want.losses[s], 1e-5, fmt::format("loss at step {}", s));
    expect_close(got.steps[s].grad_norm(), want.steps[s].grad_norm(), 1e-5,
                 fmt::format("grad norm at step {}", s));
    clipped += c.clip > 0 && want.steps[s].grad_norm() > c.clip;
  }
  if (c.clip > 0) {
    EXPECT_GT(clipped, 0) << "the clipping threshold never bit";
  }
  ASSERT_EQ(got.state.size(), want.state.size());
  for (const auto& [key, values] : want.state) {
    ASSERT_TRUE(got.state.count(key)) << key.first << " " << key.second;
    EXPECT_EQ(got.covered.at(key), values.numel()) << "pieces must cover " << key.second << " once";
    EXPECT_TRUE(torch::allclose(got.state.at(key), values, 1e-5, 1e-6))
        << key.first << " of " << key.second << " max diff "
        << (got.state.at(key) - values).abs().max().item<double>();
  }
  for (const MemoryReport& m : got.memory) {
    EXPECT_EQ(m.gathered_params, 0) << "every unit is released after step()";
    EXPECT_GT(m.gathered_params_peak, 0);
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int world : {1, 2, 3, 4}) out.push_back({world, 1, 0.0});
  out.push_back({2, 2, 0.0});
  out.push_back({3, 2, 0.5});
  out.push_back({4, 2, 0.5, false});
  out.push_back({4, 1, 0.5, true, 7});
  out.push_back({3, 2, 0.0, false, 7, 0});
  out.push_back({2, 2, 0.5, true, 7, 1000, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Worlds, Stage3MatchesStage0, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return name_of(info.param); });

StackShape big_shape(bool tied) {
  StackShape s;
  s.vocab = 64;
  s.dim = 32;
  s.layers = 2;
  s.tied = tied;
  return s;
}

int64_t numel_where(const StackProblem& p, bool small, int64_t threshold) {
  int64_t n = 0;
  for (const auto& [name, t] : p.init) n += (t.numel() < threshold) == small ? t.numel() : 0;
  return n;
}

// bf16 compute with Adam: 16Ψ/N per rank, plus the persistent parameters kept gathered (2 bytes
// each); offloading the optimizer moves master and optimizer state (12Ψ/N) to the host and keeps
// the gradient shard there in fp32 (4Ψ/N instead of 2Ψ/N on the device); offloading parameters
// moves the parameter shard (2Ψ/N).
TEST(Stage3Memory, ModelStatesAre16PsiOverNPlusPersistentParameters) {
  torch::set_num_threads(1);
  const StackProblem problem = make_stack_problem(big_shape(true), 2);
  const int64_t threshold = 40;
  const double psi = static_cast<double>(numel_where(problem, false, 0));
  const double persistent = static_cast<double>(numel_where(problem, true, threshold));
  ASSERT_GT(persistent, 0);
  for (int world : {1, 2, 3, 4}) {
    for (int offload = 0; offload < 3; ++offload) {
      StackRun run = stage_run(3, world, 1, 0.0);
      run.steps = 2;
      run.options.compute_dtype = torch::kBFloat16;
      run.options.param_persistence_threshold = threshold;
      run.options.offload_optimizer = offload >= 1;
      run.options.offload_param = offload >= 2;
      const StackResult r = run_stack(problem, run);
      const double want = (offload >= 1 ? 18 : 16) * psi / world + 2 * persistent;
      const double moved =
          (offload >= 1 ? 16 * psi / world : 0) + (offload >= 2 ? 2 * psi / world : 0);
      for (const MemoryReport& m : r.memory) {
        const auto what = fmt::format("world {} offload {}", world, offload);
        EXPECT_NEAR(static_cast<double>(m.model_states()), want, 0.05 * want) << what;
        EXPECT_NEAR(static_cast<double>(m.persistent_params), 2 * persistent, 2 * world) << what;
        EXPECT_NEAR(static_cast<double>(m.host_bytes), moved, 0.05 * want) << what;
        EXPECT_NEAR(static_cast<double>(m.device_model_states()), want - moved, 0.05 * want)
            << what;
        EXPECT_EQ(m.gathered_params, 0) << what;
      }
    }
  }
}

// stage3_prefetch_bucket_size bounds what is held gathered ahead of use: a budget of two blocks
// raises the peak of gathered bytes over no prefetch by at most two blocks, however many blocks the
// model has. Before, units already in flight were not counted, so each segment started another
// budget's worth: on this 10-block model the same budget held 6 blocks more than no prefetch.
TEST(Stage3Prefetch, HoldsAtMostTheBudgetAheadOfUse) {
  torch::set_num_threads(1);
  StackShape shape = big_shape(true);
  shape.layers = 10;
  const StackProblem problem = make_stack_problem(shape, 2);
  const int64_t block = shape.dim * shape.dim + 2 * shape.dim;  // W, b, g of one block
  for (int world : {1, 2}) {
    auto peak = [&](int64_t blocks) {
      StackRun run = stage_run(3, world, 1, 0.0);
      run.steps = 2;
      run.options.param_persistence_threshold = 0;
      run.options.prefetch_bucket_size = blocks * (block + world);  // with each unit's padding
      int64_t most = 0;
      for (const MemoryReport& m : run_stack(problem, run).memory)
        most = std::max(most, m.gathered_params_peak);
      return most;
    };
    const int64_t none = peak(0);
    const int64_t two = peak(2);
    const int64_t block_bytes = 4 * (block + world);  // fp32
    EXPECT_GE(two - none, block_bytes) << "world " << world << ": the budget prefetches";
    EXPECT_LE(two - none, 2 * block_bytes) << "world " << world;
  }
}

// Ring theory per optimizer step with A micro-steps: every unit all-gathered twice and
// reduce-scattered once per micro-step (3Ψ); the tied embedding is gathered once more (for the
// head's forward). Plus the 8-byte norm all-reduce.
TEST(Stage3Communication, BytesPerStepAre3PsiPerMicroStep) {
  torch::set_num_threads(1);
  for (bool tied : {false, true}) {
    const StackProblem problem = make_stack_problem(big_shape(tied), 1);
    const double psi = static_cast<double>(numel_where(problem, false, 0));
    const double embed = static_cast<double>(problem.init.at("embed").numel());
    for (int world : {2, 3, 4}) {
      for (int accum : {1, 2}) {
        StackRun run = stage_run(3, world, accum, 0.0);
        run.steps = 1;
        run.options.param_persistence_threshold = 0;
        const StackResult r = run_stack(problem, run);
        const double ring = (world - 1.0) / world * 4;  // fp32 bytes per element sent
        const double gathers = accum * (2 * psi + (tied ? embed : 0)) * ring;
        const double scatters = accum * psi * ring;
        const auto what = fmt::format("tied {} world {} accum {}", tied, world, accum);
        for (const comm::CommStats& s : r.comm) {
          const auto sent = [&](comm::CollectiveKind k) {
            return s.bytes_sent.count(k) ? static_cast<double>(s.bytes_sent.at(k)) : 0.0;
          };
          EXPECT_NEAR(sent(comm::CollectiveKind::kAllGather), gathers, 0.01 * gathers) << what;
          EXPECT_NEAR(sent(comm::CollectiveKind::kReduceScatter), scatters, 0.01 * scatters)
              << what;
          EXPECT_LE(sent(comm::CollectiveKind::kAllReduce), 16) << what;
        }
      }
    }
  }
}

// keep_gathered_memory (CUDA graphs): a unit's gathered copy is reused until its chunks change, so
// each trainable unit is gathered once a step whatever the accumulation (the update in step() or
// during the last backward makes it stale), and a frozen unit once for the whole run; the training
// is bit for bit that of gathering at every use.
TEST(Stage3KeptGathered, GathersATrainableUnitOnceAStepAndAFrozenOneOnce) {
  torch::set_num_threads(1);
  const StackProblem problem = make_stack_problem(big_shape(/*tied=*/true), 3);
  const double psi = static_cast<double>(numel_where(problem, false, 0));
  for (const bool update_in_backward : {false, true}) {
    for (const std::string frozen : {"", "_w"}) {
      StackRun run = stage_run(3, 2, 2, 0.0);
      run.steps = 3;
      run.options.param_persistence_threshold = 0;
      run.set_step_lr = update_in_backward;
      run.frozen_suffix = frozen;
      const StackResult every_use = run_stack(problem, run);
      run.options.keep_gathered_memory = true;
      const StackResult kept = run_stack(problem, run);
      const auto what =
          fmt::format("update in backward {}, frozen '{}'", update_in_backward, frozen);
      EXPECT_EQ(kept.losses, every_use.losses) << what;
      ASSERT_EQ(kept.state.size(), every_use.state.size()) << what;
      for (const auto& [key, value] : every_use.state) {
        EXPECT_TRUE(torch::equal(kept.state.at(key), value)) << what << " " << key.second;
      }
      EXPECT_LT(every_use.losses.back(), every_use.losses.front()) << what;
      // The last step's gathers (sent by each of the 2 ranks, fp32, ring model): the trainable
      // units once; the frozen ones not at all (gathered in the first step). Gathering at every
      // use: every unit twice per micro-step, the tied embedding once more.
      double frozen_numel = 0;
      for (const auto& [name, value] : problem.init) {
        if (!frozen.empty() && name.size() > 2 && name.substr(name.size() - 2) == frozen) {
          frozen_numel += static_cast<double>(value.numel());
        }
      }
      const double ring = 0.5 * 4;
      const double embed = static_cast<double>(problem.init.at("embed").numel());
      const double trainable = psi - frozen_numel;
      for (int rank = 0; rank < 2; ++rank) {
        const auto gathered = [&](const StackResult& r) {
          const auto& sent = r.comm[static_cast<size_t>(rank)].bytes_sent;
          const auto it = sent.find(comm::CollectiveKind::kAllGather);
          return it == sent.end() ? 0.0 : static_cast<double>(it->second);
        };
        EXPECT_NEAR(gathered(kept), trainable * ring, 0.01 * trainable * ring) << what;
        const double each_use = 2 * (2 * psi + embed) * ring;
        EXPECT_NEAR(gathered(every_use), each_use, 0.01 * each_use) << what;
      }
    }
  }
}

// Saved at world 2 stage 3 after 10 steps, resumed at other world sizes and stages: the next 10
// steps match an uninterrupted run.
TEST(Stage3Checkpoint, ResumesAtOtherWorldSizesAndStages) {
  torch::set_num_threads(1);
  const StackProblem problem = make_stack_problem();
  StackRun first = stage_run(3, 2, 1, 0.5);
  first.steps = 10;
  const StackResult saved = run_stack(problem, first);
  StackRun whole = stage_run(3, 2, 1, 0.5);
  const StackResult want = run_stack(problem, whole);
  for (auto [world, stage] : {std::pair{3, 3}, {1, 0}, {4, 2}, {2, 3}, {4, 3}}) {
    StackRun second = stage_run(stage, world, 1, 0.5);
    second.steps = 10;
    second.resume = &saved.state;
    second.resume_steps = 10;
    const StackResult got = run_stack(problem, second);
    for (int s = 0; s < 10; ++s) {
      expect_close(got.losses[s], want.losses[10 + s], 1e-5,
                   fmt::format("world {} stage {} step {}", world, stage, 10 + s));
    }
  }
}

}  // namespace
}  // namespace dstrain::zero::testing
