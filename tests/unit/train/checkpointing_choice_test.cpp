// gradient_checkpointing: auto for a run config (train/checkpointing_choice.h): the peaks are the
// model states of the run's stage plus each setting's activations, the limit decides, and the
// ranks agree on the smallest limit.

#include <gtest/gtest.h>

#include <cstdlib>

#include <mutex>
#include <vector>

#include "config/config.h"
#include "model/model_config.h"
#include "tests/common/thread_communicator.h"
#include "train/checkpointing_choice.h"
#include "zero/estimate.h"
#include "zero/estimate_activations.h"

namespace dstrain::train {
namespace {

using zero::Checkpointing;

config::Config tiny_run() {
  config::Config c;
  c.model.checkpoint_auto = true;
  c.training.per_device_train_batch_size = 8;
  c.training.bf16 = true;
  c.data.max_length = 128;
  c.zero.stage = 2;
  return c;
}

model::ModelConfig tiny_model() {
  return model::load_model_config(DSTRAIN_SOURCE_DIR "/configs/models/tiny");
}

TEST(CheckpointingChoiceForRun, PeaksAreTheStagesModelStatesPlusEachSettingsActivations) {
  const config::Config c = tiny_run();
  const model::ModelConfig m = tiny_model();
  const int world = 2;
  const int64_t states =
      zero::estimate_row(zero::estimate_input(c, m, world), 2, false, false).device();
  for (const bool cuda : {false, true}) {
    const auto rows = zero::activation_rows(zero::activation_input(c, m, cuda));
    const auto at = [&](int64_t limit) { return choose_for_run(c, m, world, cuda, limit); };
    const zero::CheckpointingChoice fits = at(states + rows[0].device);
    EXPECT_EQ(fits.setting, Checkpointing::kNone);
    EXPECT_EQ(fits.peaks[0], states + rows[0].device);
    // Fastest first: none, selective, plain, offload.
    ASSERT_EQ(rows[1].setting, Checkpointing::kSelective);
    ASSERT_EQ(rows[2].setting, Checkpointing::kPlain);
    EXPECT_EQ(at(states + rows[0].device - 1).setting, Checkpointing::kSelective);
    EXPECT_EQ(at(states + rows[1].device).setting, Checkpointing::kSelective);
    EXPECT_EQ(at(states + rows[1].device - 1).setting, Checkpointing::kPlain);
    // On a GPU offload keeps less than plain; on the CPU the same, so plain is taken.
    const zero::CheckpointingChoice tight = at(states + rows[2].device - 1);
    EXPECT_EQ(tight.setting, cuda ? Checkpointing::kOffload : Checkpointing::kPlain);
    EXPECT_EQ(tight.fits, cuda) << "cuda " << cuda;
  }
}

// The CPU ranks of a host share its memory: each plans with its LOCAL_WORLD_SIZE-th part.
TEST(CheckpointingChoiceForRun, TheCpuLimitIsTheHostsAvailableMemoryShared) {
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
TEST(CheckpointingChoiceForRun, SharedGpuRanksEachPlanWithTheirPart) {
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
TEST(CheckpointingChoiceForRun, PlanningLimitIsTheRanksPartTimesTheHeadroom) {
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

// Two ranks resolve the same choice against the smaller of their limits; the tiny run fits any
// machine without checkpointing.
TEST(CheckpointingChoiceForRun, RanksAgree) {
  std::mutex mu;
  std::vector<zero::CheckpointingChoice> got;
  dstrain::testing::run_ranks(2, [&](dstrain::testing::ThreadCommunicator& comm) {
    const torch::Device cpu(torch::kCPU);
    const auto choice =
        resolve_auto_checkpointing(tiny_run(), tiny_model(), comm, cpu, planning_limit(comm, cpu));
    std::lock_guard<std::mutex> lock(mu);
    got.push_back(choice);
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
