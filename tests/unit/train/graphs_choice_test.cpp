// training.cuda_graphs (train/graphs_choice.h): `on` takes graphs on a GPU unless something in the
// run prevents them and names what does; `auto` records them besides only below ZeRO stage 3 and
// where their memory fits, and keeps them where they pay (kAutoMinSpeedup).
#include "train/graphs_choice.h"

#include <gtest/gtest.h>

namespace dstrain::train {
namespace {

GraphsChoice choose(const config::Config& c, model::Checkpointing plan, bool cuda = true,
                    const GraphsMemory& memory = {}) {
  return choose_graphs(c, plan, cuda, memory);
}

// A config whose layers graphs can replay: packed documents set each batch's attention pieces.
config::Config replayable() {
  config::Config c;
  c.data.packing = "stream";
  return c;
}

TEST(GraphsChoice, AutoRecordsThemBelowStage3WhereTheyFitAndKeepsThemWhereTheyPay) {
  config::Config c = replayable();
  model::Checkpointing plan = model::Checkpointing::kNone;
  EXPECT_EQ(c.training.cuda_graphs, "auto");
  const GraphsMemory fits{10 << 20, 12 << 20, 12 << 20};
  const GraphsChoice gpu_auto = choose(c, plan, true, fits);
  EXPECT_TRUE(gpu_auto.on) << gpu_auto.why_not;
  EXPECT_EQ(gpu_auto.min_speedup, kAutoMinSpeedup);
  const GraphsChoice over = choose(c, plan, true, {10 << 20, 13 << 20, 12 << 20});
  EXPECT_FALSE(over.on);
  EXPECT_EQ(over.why_not,
            "their buffers would take the memory model's peak per rank from 10.00 MiB to 13.00 "
            "MiB, over the 12.00 MiB planned (training.cuda_graphs: on records them anyway, up to "
            "that model's figure)");
  const GraphsChoice cpu = choose(c, plan, /*cuda=*/false);
  EXPECT_FALSE(cpu.on);
  EXPECT_NE(cpu.why_not.find("CPU"), std::string::npos) << cpu.why_not;
  c.zero.stage = 3;
  const GraphsChoice stage3 = choose(c, plan, true, fits);
  EXPECT_FALSE(stage3.on);
  EXPECT_NE(stage3.why_not.find("at ZeRO stage 3 graphs keep every layer's gathered parameters"),
            std::string::npos)
      << stage3.why_not;
}

TEST(GraphsChoice, OnIsOnForAGpuWhateverItCosts) {
  config::Config c = replayable();
  model::Checkpointing plan = model::Checkpointing::kNone;
  c.training.cuda_graphs = "on";
  const GraphsChoice on = choose(c, plan, true, {10 << 20, 13 << 20, 12 << 20});
  EXPECT_TRUE(on.on);
  EXPECT_EQ(on.min_speedup, 0) << "kept whether they pay or not";
  c.zero.stage = 3;
  EXPECT_TRUE(choose(c, plan).on) << "on takes stage 3's kept gathers whatever they cost";
  EXPECT_FALSE(choose(c, plan, /*cuda=*/false).on);
  c.training.cuda_graphs = "off";
  const GraphsChoice off = choose(c, plan);
  EXPECT_FALSE(off.on);
  EXPECT_EQ(off.why_not, "");
}

TEST(GraphsChoice, WhatPreventsThemIsNamed) {
  config::Config c = replayable();
  c.training.cuda_graphs = "on";
  model::Checkpointing plan = model::Checkpointing::kNone;
  c.parallel.sequence_parallel_size = 2;
  EXPECT_NE(choose(c, plan).why_not.find("sequence parallelism"), std::string::npos);
  c.training.cuda_graphs = "auto";
  EXPECT_NE(choose(c, plan).why_not.find("sequence parallelism"), std::string::npos)
      << "auto names what prevents graphs before its own reason";
  c.training.cuda_graphs = "on";
  c.parallel.sequence_parallel_size = 1;
  c.model.tiled_mlp = -1;
  EXPECT_NE(choose(c, plan).why_not.find("tiled_mlp"), std::string::npos);
  c.model.tiled_mlp = 0;
  plan = model::Checkpointing::kPlain;
  EXPECT_TRUE(choose(c, plan).on) << "plain checkpointing replays the layers' recordings";
  plan = model::Checkpointing::kSelective;
  EXPECT_NE(choose(c, plan).why_not.find("selective"), std::string::npos);
  plan = model::Checkpointing::kOffload;
  EXPECT_NE(choose(c, plan).why_not.find("host"), std::string::npos);
  EXPECT_FALSE(choose(c, plan).on);
  plan = model::Checkpointing::kNone;
  for (const std::string packing : {"stream", "pad"}) {
    c.data.packing = packing;
    EXPECT_TRUE(choose(c, plan).on) << packing;
  }
  c.data.packing = "documents";
  for (const std::string setting : {"on", "auto"}) {
    c.training.cuda_graphs = setting;
    const GraphsChoice documents = choose(c, plan);
    EXPECT_FALSE(documents.on) << setting;
    EXPECT_NE(documents.why_not.find("data.packing: documents"), std::string::npos)
        << documents.why_not;
  }
}

}  // namespace
}  // namespace dstrain::train
