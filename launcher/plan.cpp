#include "launcher/plan.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

void check_request(const PlanRequest& request) {
  if (request.nodes.empty()) fail(ErrorKind::kUsage, "the launch plan needs at least one node");
  for (const NodeSpec& node : request.nodes) {
    if (node.nproc < 1) {
      fail(ErrorKind::kUsage, "node '{}': the number of processes must be >= 1, got {}", node.host,
           node.nproc);
    }
    if (!node.devices.empty() && node.devices.size() != static_cast<size_t>(node.nproc)) {
      fail(ErrorKind::kUsage, "node '{}': {} device(s) listed for {} process(es)", node.host,
           node.devices.size(), node.nproc);
    }
  }
  if (request.command.empty() || request.command[0].empty()) {
    fail(ErrorKind::kUsage, "the launch plan needs a program to run on every rank");
  }
  if (request.master_addr.empty()) fail(ErrorKind::kUsage, "--master-addr must not be empty");
  check_port(request.master_port, "--master-port");
}

std::string device_list(const std::vector<int>& devices) {
  std::string out;
  for (int d : devices) out += (out.empty() ? "" : ",") + std::to_string(d);
  return out;
}

EnvList rank_env(const WorldPlan& plan, const RankSpec& rank, const NodeSpec& node) {
  const int local_world_size = node.nproc;
  EnvList env = {
      {"RANK", std::to_string(rank.rank)},
      {"LOCAL_RANK", std::to_string(rank.local_rank)},
      {"WORLD_SIZE", std::to_string(plan.world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
      {"GROUP_RANK", std::to_string(rank.node_rank)},
      {"NODE_RANK", std::to_string(rank.node_rank)},
      {"MASTER_ADDR", plan.master_addr},
      {"MASTER_PORT", std::to_string(plan.master_port)},
  };
  if (!node.devices.empty()) env.emplace_back("CUDA_VISIBLE_DEVICES", device_list(node.devices));
  return env;
}

}  // namespace

void check_port(int port, const char* flag) {
  if (port < 1 || port > 65535) {
    fail(ErrorKind::kUsage, "{} must be a TCP port in 1..65535, got {}", flag, port);
  }
}

WorldPlan make_world_plan(const PlanRequest& request) {
  check_request(request);
  WorldPlan plan;
  plan.master_addr = request.master_addr;
  plan.master_port = request.master_port;
  for (const NodeSpec& node : request.nodes) plan.world_size += node.nproc;
  for (size_t n = 0; n < request.nodes.size(); ++n) {
    const NodeSpec& node = request.nodes[n];
    for (int local = 0; local < node.nproc; ++local) {
      RankSpec rank;
      rank.rank = static_cast<int>(plan.ranks.size());
      rank.local_rank = local;
      rank.node_rank = static_cast<int>(n);
      rank.host = node.host;
      rank.argv = request.command;
      rank.env = rank_env(plan, rank, node);
      plan.ranks.push_back(std::move(rank));
    }
  }
  return plan;
}

std::string format_parallel_groups(const WorldPlan& plan) {
  const int p = plan.sequence_parallel_size;
  if (p <= 1 || plan.world_size % p != 0) return "";
  std::string out =
      fmt::format("sequence-parallel groups of {} consecutive ranks (data-parallel size {}):\n", p,
                  plan.world_size / p);
  for (int g = 0; g < plan.world_size / p; ++g) {
    const RankSpec& first = plan.ranks[static_cast<size_t>(g * p)];
    const RankSpec& last = plan.ranks[static_cast<size_t>(g * p + p - 1)];
    out += fmt::format("  group {}: ranks {}-{}", g, first.rank, last.rank);
    if (first.node_rank == last.node_rank) {
      out += fmt::format(" on node {} ({})\n", first.node_rank, first.host);
    } else {
      out += fmt::format(" across nodes {}-{}: its all-to-alls cross the network\n",
                         first.node_rank, last.node_rank);
    }
  }
  return out;
}

std::vector<RankSpec> ranks_on_node(const WorldPlan& plan, int node_rank) {
  std::vector<RankSpec> out;
  for (const RankSpec& rank : plan.ranks) {
    if (rank.node_rank == node_rank) out.push_back(rank);
  }
  return out;
}

}  // namespace dstrain::launcher
