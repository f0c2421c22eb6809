#include "launcher/plan.h"

#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/common/expect_error.h"

namespace dstrain::launcher {
namespace {

std::map<std::string, std::string> as_map(const EnvList& env) {
  return {env.begin(), env.end()};
}

PlanRequest local_request(int nproc) {
  PlanRequest r;
  r.nodes = {{"localhost", nproc, {}}};
  r.master_port = 29500;
  r.command = {"/bin/prog", "a"};
  return r;
}

TEST(WorldPlan, LocalRanksGetTorchrunVariables) {
  WorldPlan plan = make_world_plan(local_request(3));
  ASSERT_EQ(plan.world_size, 3);
  ASSERT_EQ(plan.ranks.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    auto env = as_map(plan.ranks[i].env);
    EXPECT_EQ(env["RANK"], std::to_string(i));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(i));
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["NODE_RANK"], "0");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "29500");
    EXPECT_EQ(plan.ranks[i].argv, (std::vector<std::string>{"/bin/prog", "a"}));
    EXPECT_EQ(plan.ranks[i].host, "localhost");
  }
}

TEST(WorldPlan, SequenceParallelGroupsAreConsecutiveRanksAndNameTheirNodes) {
  PlanRequest r = local_request(1);
  r.nodes = {{"a", 2, {}}, {"b", 2, {}}};
  WorldPlan plan = make_world_plan(r);
  EXPECT_EQ(format_parallel_groups(plan), "");
  plan.parallel.sequence_parallel_size = 2;
  EXPECT_EQ(format_parallel_groups(plan),
            "sequence-parallel groups of 2 consecutive ranks (data-parallel size 2):\n"
            "  group 0: ranks 0-1 on node 0 (a)\n"
            "  group 1: ranks 2-3 on node 1 (b)\n");
  plan.parallel.sequence_parallel_size = 4;
  EXPECT_EQ(format_parallel_groups(plan),
            "sequence-parallel groups of 4 consecutive ranks (data-parallel size 1):\n"
            "  group 0: ranks 0-3 across nodes 0-1: its all-to-alls cross the network\n");
}

// Pipeline stages are the outermost split: blocks of world / P consecutive ranks, each pipeline
// the ranks at one place in every block, tensor-parallel groups consecutive inside a stage.
TEST(WorldPlan, PipelineStagesAreBlocksOfConsecutiveRanksAndThePipelinesCrossThem) {
  PlanRequest r = local_request(1);
  r.nodes = {{"a", 4, {}}, {"b", 4, {}}};
  WorldPlan plan = make_world_plan(r);
  plan.parallel.pipeline_parallel_size = 2;
  EXPECT_EQ(format_parallel_groups(plan),
            "pipeline stages: 2 blocks of 4 consecutive ranks (1f1b):\n"
            "  stage 0: ranks 0-3 on node 0 (a)\n"
            "  stage 1: ranks 4-7 on node 1 (b)\n"
            "pipelines of 2 ranks 4 apart:\n"
            "  group 0: ranks 0, 4 across nodes 0-1: its activations cross the network\n"
            "  group 1: ranks 1, 5 across nodes 0-1: its activations cross the network\n"
            "  group 2: ranks 2, 6 across nodes 0-1: its activations cross the network\n"
            "  group 3: ranks 3, 7 across nodes 0-1: its activations cross the network\n"
            "data-parallel size 4: ZeRO shards each stage over its 4 ranks\n");
  plan.parallel.tensor_parallel_size = 2;
  plan.parallel.pipeline_virtual_stages = 2;
  EXPECT_EQ(format_parallel_groups(plan),
            "pipeline stages: 2 blocks of 4 consecutive ranks, 2 virtual stages per rank "
            "(interleaved 1F1B):\n"
            "  stage 0: ranks 0-3 on node 0 (a)\n"
            "  stage 1: ranks 4-7 on node 1 (b)\n"
            "pipelines of 2 ranks 4 apart:\n"
            "  group 0: ranks 0, 4 across nodes 0-1: its activations cross the network\n"
            "  group 1: ranks 1, 5 across nodes 0-1: its activations cross the network\n"
            "  group 2: ranks 2, 6 across nodes 0-1: its activations cross the network\n"
            "  group 3: ranks 3, 7 across nodes 0-1: its activations cross the network\n"
            "tensor-parallel groups of 2 consecutive ranks (sequence parallelism between the "
            "layers' parallel regions):\n"
            "  group 0: ranks 0-1 on node 0 (a)\n"
            "  group 1: ranks 2-3 on node 0 (a)\n"
            "  group 2: ranks 4-5 on node 1 (b)\n"
            "  group 3: ranks 6-7 on node 1 (b)\n"
            "data-parallel size 2: ZeRO shards each tensor-parallel slice of a stage over the 2 "
            "ranks that hold it\n");
  check_tensor_parallel_nodes(plan);
}

// Tensor-parallel groups are consecutive ranks, sequence-parallel groups T apart inside each
// data-parallel block (train/tensor_parallel.h); a tensor-parallel group across nodes is refused
// unless allowed.
TEST(WorldPlan, TensorParallelGroupsAreConsecutiveAndTheSequenceParallelOnesTApart) {
  PlanRequest r = local_request(1);
  r.nodes = {{"a", 4, {}}, {"b", 4, {}}};
  WorldPlan plan = make_world_plan(r);
  plan.parallel.tensor_parallel_size = 2;
  plan.parallel.sequence_parallel_size = 2;
  plan.parallel.tensor_sequence_parallel = false;
  EXPECT_EQ(format_parallel_groups(plan),
            "tensor-parallel groups of 2 consecutive ranks:\n"
            "  group 0: ranks 0-1 on node 0 (a)\n"
            "  group 1: ranks 2-3 on node 0 (a)\n"
            "  group 2: ranks 4-5 on node 1 (b)\n"
            "  group 3: ranks 6-7 on node 1 (b)\n"
            "sequence-parallel groups of 2 ranks 2 apart (data-parallel size 2):\n"
            "  group 0: ranks 0, 2 on node 0 (a)\n"
            "  group 1: ranks 1, 3 on node 0 (a)\n"
            "  group 2: ranks 4, 6 on node 1 (b)\n"
            "  group 3: ranks 5, 7 on node 1 (b)\n"
            "data-parallel size 2: ZeRO shards each tensor-parallel slice over the 4 ranks that "
            "hold it\n");
  check_tensor_parallel_nodes(plan);
  plan.parallel.tensor_parallel_size = 8;
  plan.parallel.sequence_parallel_size = 1;
  EXPECT_THAT(
      format_parallel_groups(plan),
      ::testing::HasSubstr("  group 0: ranks 0-7 across nodes 0-1: its per-layer collectives cross "
                           "the network\n"));
  dstrain::testing::expect_error([&] { check_tensor_parallel_nodes(plan); }, ErrorKind::kConfig,
                                 {"parallel.tensor_parallel_size (8): tensor-parallel group 0 "
                                  "(ranks 0-7) spans nodes 0 (a) and 1 (b)",
                                  "parallel.tensor_parallel_across_nodes: true"});
  plan.parallel.tensor_parallel_across_nodes = true;
  check_tensor_parallel_nodes(plan);
  // Slurm's shape: 3 ranks a node cannot hold groups of 2.
  config::ParallelSection p;
  p.tensor_parallel_size = 2;
  dstrain::testing::expect_error(
      [&] {
        check_tensor_parallel_nodes(p, {3, 3}, {"n0", "n1"});
      },
      ErrorKind::kConfig, {"tensor-parallel group 1 (ranks 2-3) spans nodes 0 (n0) and 1 (n1)"});
  check_tensor_parallel_nodes(p, {4, 4}, {"n0", "n1"});
}

TEST(WorldPlan, RanksFollowNodeOrderAcrossNodes) {
  PlanRequest r = local_request(1);
  r.nodes = {{"a", 2, {}}, {"b", 3, {}}};
  r.master_addr = "10.0.0.1";
  WorldPlan plan = make_world_plan(r);
  ASSERT_EQ(plan.world_size, 5);
  auto rank3 = as_map(plan.ranks[3].env);
  EXPECT_EQ(plan.ranks[3].host, "b");
  EXPECT_EQ(rank3["RANK"], "3");
  EXPECT_EQ(rank3["LOCAL_RANK"], "1");
  EXPECT_EQ(rank3["LOCAL_WORLD_SIZE"], "3");
  EXPECT_EQ(rank3["GROUP_RANK"], "1");
  EXPECT_EQ(rank3["NODE_RANK"], "1");
  EXPECT_EQ(rank3["WORLD_SIZE"], "5");
  EXPECT_EQ(rank3["MASTER_ADDR"], "10.0.0.1");
  std::vector<RankSpec> node_b = ranks_on_node(plan, 1);
  ASSERT_EQ(node_b.size(), 3u);
  EXPECT_EQ(node_b[0].rank, 2);
  EXPECT_EQ(node_b[2].rank, 4);
}

TEST(WorldPlan, EnvOrderIsStable) {
  WorldPlan plan = make_world_plan(local_request(1));
  std::vector<std::string> names;
  for (const auto& kv : plan.ranks[0].env) names.push_back(kv.first);
  EXPECT_EQ(names,
            (std::vector<std::string>{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                      "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT"}));
}

void expect_usage_error(const PlanRequest& r, const std::string& needle) {
  try {
    make_world_plan(r);
    FAIL() << "expected an error containing " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(WorldPlan, RejectsBadRequests) {
  PlanRequest r = local_request(0);
  expect_usage_error(r, ">= 1");
  r = local_request(1);
  r.nodes.clear();
  expect_usage_error(r, "at least one node");
  r = local_request(1);
  r.command.clear();
  expect_usage_error(r, "program");
  r = local_request(1);
  r.master_port = 70000;
  expect_usage_error(r, "--master-port");
  r.master_port = 0;
  expect_usage_error(r, "1..65535");
  r = local_request(1);
  r.master_addr = "";
  expect_usage_error(r, "--master-addr");
}

}  // namespace
}  // namespace dstrain::launcher
