#pragma once
// The world plan: which ranks run where, with which environment and command line. A pure function
// of its request (no I/O, no clock, no randomness), so the same plan can be printed by --dry-run,
// spawned locally, or shipped to remote nodes, and unit tested without processes.
//
// Rank order follows node order: node 0 holds ranks [0, n0), node 1 the next n1 ranks, and so on.
// Every rank gets the torchrun variables: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, NODE_RANK (= GROUP_RANK), MASTER_ADDR, MASTER_PORT, and CUDA_VISIBLE_DEVICES when
// the node names its devices.

#include <string>
#include <utility>
#include <vector>

#include "config/config.h"

namespace dstrain::launcher {

// Ordered (name, value) pairs; order is preserved so printed plans are stable.
using EnvList = std::vector<std::pair<std::string, std::string>>;

struct NodeSpec {
  std::string host;  // how the node is reached/named ("localhost" for a local run)
  int nproc = 1;     // ranks on this node (>= 1)
  // Device indices given to this node's ranks as CUDA_VISIBLE_DEVICES (LOCAL_RANK indexes into
  // it). Empty: the variable is not set (local runs, Slurm-assigned devices). Else nproc entries.
  std::vector<int> devices;
};

struct PlanRequest {
  std::vector<NodeSpec> nodes;  // at least one
  std::string master_addr = "127.0.0.1";
  int master_port = 0;               // 1..65535; the caller resolves "pick a free port" beforehand
  std::vector<std::string> command;  // argv of every rank; command[0] is the program path
};

struct RankSpec {
  int rank = 0;
  int local_rank = 0;
  int node_rank = 0;
  std::string host;
  std::vector<std::string> argv;  // argv[0] is the program path
  EnvList env;                    // variables set on top of the launcher's own environment
};

struct WorldPlan {
  int world_size = 0;
  std::string master_addr;
  int master_port = 0;
  std::vector<RankSpec> ranks;  // ranks[i].rank == i
  // The run's parallel section (the defaults with --exec): its tensor-parallel groups are
  // tensor_parallel_size consecutive ranks, its sequence-parallel groups sequence_parallel_size
  // ranks tensor_parallel_size apart (train/tensor_parallel.h).
  config::ParallelSection parallel;
};

// Builds the plan. Throws Error(kUsage) for an empty node list, nproc < 1, devices not matching
// nproc, an empty command, an empty master address or a port outside 1..65535.
WorldPlan make_world_plan(const PlanRequest& request);

// The ranks of one node, in rank order (what a node agent spawns).
std::vector<RankSpec> ranks_on_node(const WorldPlan& plan, int node_rank);

// For --dry-run: the tensor-parallel and the sequence-parallel groups, one line each ("  group 0:
// ranks 0-1 on node 0 (host)"), a group spread over nodes marked as such (its collectives then
// cross the network), and the data-parallel degree. Empty without either.
std::string format_parallel_groups(const WorldPlan& plan);

// Error(kConfig) naming parallel.tensor_parallel_size, the group and its nodes when a
// tensor-parallel group spans nodes, unless parallel.tensor_parallel_across_nodes: of `plan`, or
// of nodes holding `ranks_per_node` consecutive ranks each, named `hosts`.
void check_tensor_parallel_nodes(const WorldPlan& plan);
void check_tensor_parallel_nodes(const config::ParallelSection& parallel,
                                 const std::vector<int>& ranks_per_node,
                                 const std::vector<std::string>& hosts);

// Throws Error(kUsage) naming `flag` unless 1 <= port <= 65535.
void check_port(int port, const char* flag);

}  // namespace dstrain::launcher
