// The run plan (train/run_plan.h): each auto choice resolved from the memory model of the run's
// blocks against a limit, purely (no model memory, no device), in order (micro-batch, then
// checkpointing, then CUDA graphs), what it says at start-up, and the memory limit the ranks plan
// with.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "config/config.h"
#include "core/error.h"
#include "model/model_config.h"
#include "tests/common/thread_communicator.h"
#include "train/memory_limit.h"
#include "train/run_plan.h"

namespace dstrain::train {
namespace {

using model::Checkpointing;
using ::testing::HasSubstr;

config::Config tiny_run() {
  config::Config c;
  c.model.gradient_checkpointing = "auto";
  c.training.per_device_train_batch_size = 8;
  c.training.bf16 = true;
  c.data.max_length = 128;
  c.zero.stage = 2;
  return c;
}

model::ModelConfig tiny_model() {
  return model::load_model_config(DSTRAIN_SOURCE_DIR "/configs/models/tiny");
}

// The model states the auto choices plan with: the row of the run's stage and offload settings.
TEST(RunMemory, ModelStatesAreTheRowOfTheRunsStageAndOffload) {
  config::Config c;
  c.training.bf16 = true;
  const estimate::EstimateInput in = RunMemory(c, tiny_model(), 4, false).model_states_input();
  EXPECT_EQ(in.compute_bytes, 2);
  EXPECT_EQ(in.world_size, 4);
  const auto states = [&](const config::Config& at) {
    return RunMemory(at, tiny_model(), 4, false).model_states();
  };
  c.zero.stage = 2;
  EXPECT_EQ(states(c), estimate::estimate_row(in, 2, false, false).device());
  c.zero.stage = 3;
  c.zero.offload_optimizer.device = "cpu";
  const int64_t offloaded = states(c);
  EXPECT_EQ(offloaded, estimate::estimate_row(in, 3, true, false).device());
  c.zero.offload_param.device = "cpu";
  EXPECT_EQ(states(c), estimate::estimate_row(in, 3, true, true).device());
  EXPECT_LT(states(c), offloaded);
}

// The prediction is the memory model's: model states of the stage plus one micro-batch's
// activations, which grow linearly with it (every activation term is per token).
TEST(RunMemory, PeakIsStatesPlusTheMicroBatchsActivations) {
  config::Config c;
  c.data.max_length = 64;
  c.zero.stage = 2;
  const RunMemory memory(c, tiny_model(), 2, /*cuda=*/false);
  const int64_t p1 = memory.peak(1, Checkpointing::kNone);
  const int64_t p4 = memory.peak(4, Checkpointing::kNone);
  const int64_t activations4 =
      estimate::activation_row(memory.activations(4), Checkpointing::kNone).device;
  EXPECT_EQ(p4, memory.model_states() + activations4);
  EXPECT_GT(p4, p1);
  // Checkpointing keeps less per micro-batch, so the same limit admits a larger one.
  EXPECT_LT(memory.peak(4, Checkpointing::kPlain), p4);
}

// gradient_checkpointing: auto: the peaks are the model states of the run's stage plus each
// setting's activations, and the limit decides.
TEST(RunPlan, CheckpointingAutoTakesTheFastestSettingThatFits) {
  const config::Config c = tiny_run();
  const int world = 2;
  for (const bool cuda : {false, true}) {
    const RunMemory memory(c, tiny_model(), world, cuda);
    const int64_t states = memory.model_states();
    const auto rows = estimate::activation_rows(memory.activations());
    const auto at = [&](int64_t limit) { return choose_checkpointing(memory, 8, limit); };
    const estimate::CheckpointingChoice fits = at(states + rows[0].device);
    EXPECT_EQ(fits.setting, Checkpointing::kNone);
    EXPECT_EQ(fits.peaks[0], states + rows[0].device);
    // Fastest first: none, selective, plain, offload.
    ASSERT_EQ(rows[1].setting, Checkpointing::kSelective);
    ASSERT_EQ(rows[2].setting, Checkpointing::kPlain);
    EXPECT_EQ(at(states + rows[0].device - 1).setting, Checkpointing::kSelective);
    EXPECT_EQ(at(states + rows[1].device).setting, Checkpointing::kSelective);
    EXPECT_EQ(at(states + rows[1].device - 1).setting, Checkpointing::kPlain);
    // On a GPU offload keeps less than plain; on the CPU the same, so plain is taken.
    const estimate::CheckpointingChoice tight = at(states + rows[2].device - 1);
    EXPECT_EQ(tight.setting, cuda ? Checkpointing::kOffload : Checkpointing::kPlain);
    EXPECT_EQ(tight.fits, cuda) << "cuda " << cuda;
    // The whole plan comes to the same choice at that limit.
    RunFacts facts;
    facts.world_size = world;
    facts.cuda = cuda;
    facts.limit = states + rows[1].device - 1;
    EXPECT_EQ(resolve_run_plan(c, tiny_model(), facts).checkpointing, Checkpointing::kPlain);
  }
}

// Both auto settings: the micro-batch is planned without checkpointing whenever micro-batch 1 fits
// without; else for the first setting (fastest first) under which some micro-batch fits, its
// largest — not micro-batch 1 without checkpointing that does not fit. The checkpointing choice
// made afterwards for that micro-batch comes to the same setting.
TEST(RunPlan, WithBothAutoTheFirstSettingThatFitsIsPlannedFor) {
  config::Config c;
  c.data.max_length = 512;
  c.training.micro_batch_auto = true;
  c.training.gradient_accumulation_steps = 8;
  c.model.gradient_checkpointing = "auto";
  const RunMemory memory(c, tiny_model(), 1, /*cuda=*/false);
  const auto peak = [&](int64_t micro, Checkpointing s) { return memory.peak(micro, s); };
  RunFacts facts;
  // Ample memory: no checkpointing, the whole batch.
  facts.limit = peak(8, Checkpointing::kNone);
  RunPlan plan = resolve_run_plan(c, tiny_model(), facts);
  EXPECT_EQ(plan.micro_batch, 8);
  EXPECT_EQ(plan.accumulation, 1);
  EXPECT_EQ(plan.checkpointing, Checkpointing::kNone);
  // Micro-batch 1 fits without checkpointing: still none (the fastest), micro-batch 1.
  facts.limit = peak(1, Checkpointing::kNone);
  plan = resolve_run_plan(c, tiny_model(), facts);
  EXPECT_EQ(plan.checkpointing, Checkpointing::kNone);
  EXPECT_EQ(plan.micro_batch, 1);
  EXPECT_EQ(plan.accumulation, 8);
  // Just below that: the first setting of the choice's order that lets a micro-batch fit, with
  // its largest micro-batch.
  facts.limit = peak(1, Checkpointing::kNone) - 1;
  plan = resolve_run_plan(c, tiny_model(), facts);
  ASSERT_TRUE(plan.micro_batch_auto);
  ASSERT_TRUE(plan.micro_batch_auto->fits);
  Checkpointing first = Checkpointing::kNone;
  for (const Checkpointing s : model::kCheckpointingSettings) {
    if (s != Checkpointing::kNone && peak(1, s) <= facts.limit) {
      first = s;
      break;
    }
  }
  ASSERT_NE(first, Checkpointing::kNone);
  EXPECT_EQ(plan.micro_batch_auto->checkpointing, first);
  EXPECT_EQ(plan.checkpointing, first);
  EXPECT_LE(peak(plan.micro_batch, first), facts.limit);
  for (int64_t larger : divisors_descending(8)) {
    if (larger > plan.micro_batch) {
      EXPECT_GT(peak(larger, first), facts.limit) << larger;
    }
  }
  EXPECT_GT(plan.micro_batch, 1) << "the case should let checkpointing admit a larger micro-batch";
  EXPECT_THAT(
      plan_lines(plan, c).at(0).text,
      HasSubstr(std::string("with gradient_checkpointing ") + model::checkpointing_word(first)));
  // Without checkpointing auto the run's own setting is planned for, fitting or not.
  c.model.gradient_checkpointing = "false";
  plan = resolve_run_plan(c, tiny_model(), facts);
  EXPECT_FALSE(plan.micro_batch_auto->fits);
  EXPECT_EQ(plan.micro_batch, 1);
  EXPECT_EQ(plan.checkpointing, Checkpointing::kNone);
  EXPECT_FALSE(plan.checkpointing_auto);
  const std::vector<PlanLine> lines = plan_lines(plan, c);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[1].warning);
}

// A micro-batch the checkpoint recorded is kept; no prediction is made for it.
TEST(RunPlan, AMicroBatchKeptFromTheCheckpointIsTaken) {
  config::Config c;
  c.training.micro_batch_auto = true;
  c.training.gradient_accumulation_steps = 8;
  RunFacts facts;
  facts.world_size = 2;
  facts.limit = 1;  // nothing would fit
  facts.kept_micro_batch = 4;
  const RunPlan plan = resolve_run_plan(c, tiny_model(), facts);
  EXPECT_EQ(plan.micro_batch, 4);
  EXPECT_EQ(plan.accumulation, 2);
  EXPECT_TRUE(plan.micro_batch_kept);
  EXPECT_FALSE(plan.micro_batch_auto);
  EXPECT_EQ(plan_lines(plan, c).at(0).text,
            "micro-batch auto: 4 × accumulation 2 = global 16, kept from the checkpoint");
}

// The same inputs give the same plan (the ranks resolve it each on their own); CUDA graphs' auto
// is decided with the checkpointing and micro-batch chosen before it; without an auto choice no
// limit is needed, with one a plan without a limit is a bug.
TEST(RunPlan, IsAPureFunctionOfConfigModelAndFacts) {
  config::Config c = tiny_run();
  c.training.cuda_graphs = "auto";
  c.data.packing = "stream";  // documents keep graphs off (graphs_choice_test.cpp)
  RunFacts facts;
  facts.world_size = 2;
  facts.cuda = true;
  facts.limit = int64_t{80} << 30;
  const RunPlan a = resolve_run_plan(c, tiny_model(), facts);
  const RunPlan b = resolve_run_plan(c, tiny_model(), facts);
  EXPECT_EQ(a.checkpointing, Checkpointing::kNone);
  EXPECT_EQ(a.checkpointing, b.checkpointing);
  EXPECT_TRUE(a.graphs.on);
  EXPECT_EQ(a.graphs.min_speedup, kAutoMinSpeedup);
  EXPECT_GT(a.graph_pool_budget, 0);
  EXPECT_EQ(a.graph_pool_budget, b.graph_pool_budget);
  EXPECT_EQ(a.engine.stage, 2);
  EXPECT_NE(a.memory->model().get(), b.memory->model().get()) << "one model per plan";
  // Where checkpointing auto has to choose selective, graphs cannot run and say why.
  facts.limit =
      a.memory->model_states() + estimate::activation_rows(a.memory->activations())[0].device - 1;
  const RunPlan tight = resolve_run_plan(c, tiny_model(), facts);
  EXPECT_EQ(tight.checkpointing, Checkpointing::kSelective);
  EXPECT_FALSE(tight.graphs.on);
  const std::vector<PlanLine> said = plan_lines(tight, c);
  ASSERT_EQ(said.size(), 3u);
  EXPECT_THAT(said[1].text, HasSubstr("CUDA graphs off: selective"));
  EXPECT_EQ(said[2].text, "parallel layout: pipeline 1 x data 2 x sequence 1 x tensor 1 (2 ranks)");
  facts.limit = 0;
  EXPECT_THROW(resolve_run_plan(c, tiny_model(), facts), Error);
  c.model.gradient_checkpointing = "true";
  c.training.cuda_graphs = "off";
  const RunPlan fixed = resolve_run_plan(c, tiny_model(), facts);
  EXPECT_EQ(fixed.checkpointing, Checkpointing::kPlain);
  ASSERT_EQ(plan_lines(fixed, c).size(), 1u) << "the layout alone";
  EXPECT_THAT(plan_lines(fixed, c)[0].text, HasSubstr("parallel layout"));
  facts.world_size = 1;
  EXPECT_TRUE(plan_lines(resolve_run_plan(c, tiny_model(), facts), c).empty());
}

// gradient_checkpointing: auto with pipeline parallelism: each pipeline rank takes the fastest
// setting that fits its own stages (1F1B: the first keeps P micro-batches in flight, the last
// one), said per rank.
TEST(RunPlan, CheckpointingAutoIsEachPipelineRanksOwn) {
  config::Config c = tiny_run();
  c.parallel.pipeline_parallel_size = 2;
  c.training.gradient_accumulation_steps = 4;
  const RunMemory memory(c, tiny_model(), 2, /*cuda=*/false);
  const auto peak = [&](int p, Checkpointing s) {
    return memory.model_states(p) +
           estimate::activation_row(memory.activations(0, false, p), s).device;
  };
  ASSERT_GT(peak(0, Checkpointing::kNone), peak(1, Checkpointing::kNone));
  RunFacts facts;
  facts.world_size = 2;
  // Room for the last rank without checkpointing, not for the first.
  facts.limit = peak(1, Checkpointing::kNone);
  ASSERT_LT(facts.limit, peak(0, Checkpointing::kNone));
  const RunPlan plan = resolve_run_plan(c, tiny_model(), facts);
  ASSERT_EQ(plan.stage_checkpointing.size(), 2u);
  EXPECT_NE(plan.checkpointing_of(0), Checkpointing::kNone);
  EXPECT_EQ(plan.checkpointing_of(0), plan.checkpointing);  // the fullest's
  EXPECT_EQ(plan.checkpointing_of(1), Checkpointing::kNone);
  const std::vector<PlanLine> said = plan_lines(plan, c);
  EXPECT_THAT(said[0].text, HasSubstr("pipeline rank 0: "));
  EXPECT_THAT(said[1].text, HasSubstr("pipeline rank 1: "));
}

// A pipeline's stages are the plan's, said with its schedule's idle share; ZeRO 2 warned about.
TEST(RunPlan, PipelineStagesAndScheduleAreSaid) {
  config::Config c = tiny_run();
  c.model.gradient_checkpointing = "false";
  c.parallel.pipeline_parallel_size = 2;
  c.training.gradient_accumulation_steps = 4;
  c.zero.stage = 2;
  RunFacts facts;
  facts.world_size = 2;
  const RunPlan plan = resolve_run_plan(c, tiny_model(), facts);
  ASSERT_EQ(plan.stages.size(), 2u);
  EXPECT_EQ(plan.stages.front().first, 0u);
  EXPECT_EQ(plan.stages.back().second, plan.memory->model()->blocks().size());
  const std::vector<PlanLine> said = plan_lines(plan, c);
  ASSERT_EQ(said.size(), 4u);
  EXPECT_THAT(said[1].text, HasSubstr("pipeline stages (block 0 the embedding"));
  EXPECT_THAT(said[2].text, HasSubstr("idles about 20% of a step"));
  EXPECT_TRUE(said[3].warning);
  EXPECT_THAT(said[3].text, HasSubstr("zero stage 2 with pipeline parallelism"));
}

// The CPU ranks of a host share its memory: each plans with its LOCAL_WORLD_SIZE-th part.
TEST(MemoryLimit, TheCpuLimitIsTheHostsAvailableMemoryShared) {
  const torch::Device cpu(torch::kCPU);
  ASSERT_GT(available_memory(cpu), 0);
  ::setenv("LOCAL_WORLD_SIZE", "4", 1);
  const double quarter = static_cast<double>(memory_per_rank(cpu));
  const double whole = static_cast<double>(available_memory(cpu));
  ::unsetenv("LOCAL_WORLD_SIZE");
  EXPECT_NEAR(quarter, whole / 4, 0.05 * whole / 4);  // MemAvailable moves a little between reads
  EXPECT_NEAR(static_cast<double>(memory_per_rank(cpu)), whole, 0.05 * whole);
}

// The --share-gpu ranks share one GPU as the CPU ranks share a host; a rank with a GPU of its own
// has all of it. (The device is only named: no GPU is needed.)
TEST(MemoryLimit, SharedGpuRanksEachPlanWithTheirPart) {
  const torch::Device gpu(torch::kCUDA, 0);
  ::setenv("LOCAL_WORLD_SIZE", "4", 1);
  EXPECT_EQ(ranks_sharing_memory(gpu), 1);
  EXPECT_EQ(ranks_sharing_memory(torch::Device(torch::kCPU)), 4);
  ::setenv("DSTRAIN_SHARE_GPU", "1", 1);
  EXPECT_EQ(ranks_sharing_memory(gpu), 4);
  ::unsetenv("DSTRAIN_SHARE_GPU");
  ::unsetenv("LOCAL_WORLD_SIZE");
}

// The limit both auto choices plan with: the smallest rank's part times kHeadroom, one value on
// every rank (2 ranks of one host, each with half of MemAvailable).
TEST(MemoryLimit, PlanningLimitIsTheRanksPartTimesTheHeadroom) {
  const torch::Device cpu(torch::kCPU);
  const double whole = static_cast<double>(available_memory(cpu));
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  std::mutex mu;
  std::vector<int64_t> got;
  dstrain::testing::run_ranks(2, [&](dstrain::testing::ThreadCommunicator& comm) {
    const int64_t limit = planning_limit(comm, cpu);
    std::lock_guard<std::mutex> lock(mu);
    got.push_back(limit);
  });
  ::unsetenv("LOCAL_WORLD_SIZE");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], got[1]);
  const double expected = whole / 2 * kHeadroom;
  EXPECT_NEAR(static_cast<double>(got[0]), expected, 0.05 * expected);
}

// Two ranks resolve the same plan against the smaller of their limits; the tiny run fits any
// machine without checkpointing.
TEST(RunPlan, RanksAgree) {
  std::mutex mu;
  std::vector<estimate::CheckpointingChoice> got;
  dstrain::testing::run_ranks(2, [&](dstrain::testing::ThreadCommunicator& comm) {
    const torch::Device cpu(torch::kCPU);
    RunFacts facts;
    facts.world_size = 2;
    facts.limit = planning_limit(comm, cpu);
    const RunPlan plan = resolve_run_plan(tiny_run(), tiny_model(), facts);
    std::lock_guard<std::mutex> lock(mu);
    got.push_back(*plan.checkpointing_auto);
  });
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].setting, Checkpointing::kNone);
  EXPECT_EQ(got[1].setting, Checkpointing::kNone);
  EXPECT_EQ(got[0].limit, got[1].limit) << "the ranks' limits were not reduced to one";
  EXPECT_TRUE(got[0].fits);
  EXPECT_GT(got[0].limit, got[0].peaks[0]);
}

}  // namespace
}  // namespace dstrain::train
