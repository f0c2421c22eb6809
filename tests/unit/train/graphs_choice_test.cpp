// training.cuda_graphs (train/graphs_choice.h): auto takes graphs on a GPU unless something in the
// run prevents them, names what does, and at stage 3 weighs the gathered model against memory.
#include "train/graphs_choice.h"

#include <gtest/gtest.h>

namespace dstrain::train {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

GraphsChoice choose(const config::Config& c, const ParallelPlan& plan, bool cuda = true,
                    int64_t gathered = kGiB, int64_t limit = 70 * kGiB) {
  return choose_graphs(c, plan, cuda, gathered, limit);
}

TEST(GraphsChoice, AutoIsOnForAGpuAndOffForTheCpu) {
  config::Config c;
  ParallelPlan plan;
  EXPECT_TRUE(choose(c, plan).on);
  const GraphsChoice cpu = choose(c, plan, /*cuda=*/false);
  EXPECT_FALSE(cpu.on);
  EXPECT_NE(cpu.why_not.find("CPU"), std::string::npos) << cpu.why_not;
  c.training.cuda_graphs = "off";
  const GraphsChoice off = choose(c, plan);
  EXPECT_FALSE(off.on);
  EXPECT_EQ(off.why_not, "");
}

TEST(GraphsChoice, WhatPreventsThemIsNamedForAutoAndOn) {
  for (const char* setting : {"auto", "on"}) {
    config::Config c;
    c.training.cuda_graphs = setting;
    ParallelPlan plan;
    c.parallel.sequence_parallel_size = 2;
    EXPECT_NE(choose(c, plan).why_not.find("sequence parallelism"), std::string::npos);
    c.parallel.sequence_parallel_size = 1;
    plan.tiled_mlp = -1;
    EXPECT_NE(choose(c, plan).why_not.find("tiled_mlp"), std::string::npos);
    plan.tiled_mlp = 0;
    plan.checkpointing = true;
    EXPECT_TRUE(choose(c, plan).on) << "plain checkpointing replays the layers' recordings";
    plan.checkpoint_selective = true;
    EXPECT_NE(choose(c, plan).why_not.find("selective"), std::string::npos);
    plan.checkpoint_selective = false;
    plan.checkpoint_offload = true;
    EXPECT_NE(choose(c, plan).why_not.find("host"), std::string::npos);
    EXPECT_FALSE(choose(c, plan).on);
  }
}

TEST(GraphsChoice, Stage3AutoWeighsTheGatheredModelAgainstMemory) {
  config::Config c;
  c.zero.stage = 3;
  ParallelPlan plan;
  EXPECT_TRUE(graphs_need_limit(c, true));
  EXPECT_FALSE(graphs_need_limit(c, false));
  // Qwen2.5-0.5B in bf16 (~1 GB) on 70 GiB: on. An 8B model (16 GB) on 70 GiB: off, said why.
  EXPECT_TRUE(choose(c, plan, true, 988 * (int64_t{1} << 20), 70 * kGiB).on);
  const GraphsChoice big = choose(c, plan, true, 16 * kGiB, 70 * kGiB);
  EXPECT_FALSE(big.on);
  EXPECT_NE(big.why_not.find("stage 3"), std::string::npos) << big.why_not;
  c.training.cuda_graphs = "on";
  EXPECT_FALSE(graphs_need_limit(c, true));
  EXPECT_TRUE(choose(c, plan, true, 16 * kGiB, 70 * kGiB).on);
  c.training.cuda_graphs = "auto";
  c.zero.stage = 2;
  EXPECT_TRUE(choose(c, plan, true, 16 * kGiB, 70 * kGiB).on);
}

}  // namespace
}  // namespace dstrain::train
