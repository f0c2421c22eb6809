// training.cuda_graphs (train/graphs_choice.h): `on` takes graphs on a GPU unless something in the
// run prevents them and names what does; `auto` records none and says why.
#include "train/graphs_choice.h"

#include <gtest/gtest.h>

namespace dstrain::train {
namespace {

GraphsChoice choose(const config::Config& c, const ParallelPlan& plan, bool cuda = true) {
  return choose_graphs(c, plan, cuda);
}

TEST(GraphsChoice, OnIsOnForAGpuAndAutoRecordsNoneSayingWhy) {
  config::Config c;
  ParallelPlan plan;
  EXPECT_EQ(c.training.cuda_graphs, "auto");
  const GraphsChoice gpu_auto = choose(c, plan);
  EXPECT_FALSE(gpu_auto.on);
  EXPECT_EQ(gpu_auto.why_not, kAutoLeavesGraphsOff);
  const GraphsChoice cpu = choose(c, plan, /*cuda=*/false);
  EXPECT_FALSE(cpu.on);
  EXPECT_NE(cpu.why_not.find("CPU"), std::string::npos) << cpu.why_not;
  c.training.cuda_graphs = "on";
  EXPECT_TRUE(choose(c, plan).on);
  c.zero.stage = 3;
  EXPECT_TRUE(choose(c, plan).on) << "on takes stage 3's kept gathers whatever they cost";
  EXPECT_FALSE(choose(c, plan, /*cuda=*/false).on);
  c.training.cuda_graphs = "off";
  const GraphsChoice off = choose(c, plan);
  EXPECT_FALSE(off.on);
  EXPECT_EQ(off.why_not, "");
}

TEST(GraphsChoice, WhatPreventsThemIsNamed) {
  config::Config c;
  c.training.cuda_graphs = "on";
  ParallelPlan plan;
  c.parallel.sequence_parallel_size = 2;
  EXPECT_NE(choose(c, plan).why_not.find("sequence parallelism"), std::string::npos);
  c.training.cuda_graphs = "auto";
  EXPECT_NE(choose(c, plan).why_not.find("sequence parallelism"), std::string::npos)
      << "auto names what prevents graphs before its own reason";
  c.training.cuda_graphs = "on";
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

}  // namespace
}  // namespace dstrain::train
