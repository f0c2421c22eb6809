#include "launcher/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "layout/parallel_layout.h"

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

namespace {

// Every group over `axes`, in the order of their indices, each as its ranks.
std::vector<std::vector<int>> groups_over(const layout::ParallelLayout& l, layout::Axes axes) {
  std::vector<std::vector<int>> out(static_cast<size_t>(l.world_size() / l.group_size(axes)));
  for (int r = 0; r < l.world_size(); ++r) {
    auto& g = out[static_cast<size_t>(l.group_index(axes, r))];
    if (g.empty()) g = l.group_ranks(axes, r);
  }
  return out;
}

// "  group 0: ranks 0-1 on node 0 (host)\n", or "ranks 0, 2, 4" when they are not consecutive.
std::string group_line(const WorldPlan& plan, int g, const std::vector<int>& ranks,
                       const char* collectives, const char* label = "group") {
  const RankSpec& first = plan.ranks[static_cast<size_t>(ranks.front())];
  const RankSpec& last = plan.ranks[static_cast<size_t>(ranks.back())];
  std::string out = fmt::format("  {} {}: ranks ", label, g);
  if (ranks.back() - ranks.front() + 1 == static_cast<int>(ranks.size())) {
    out += fmt::format("{}-{}", first.rank, last.rank);
  } else {
    out += fmt::format("{}", fmt::join(ranks, ", "));
  }
  if (first.node_rank == last.node_rank) {
    return out + fmt::format(" on node {} ({})\n", first.node_rank, first.host);
  }
  return out + fmt::format(" across nodes {}-{}: its {} cross the network\n", first.node_rank,
                           last.node_rank, collectives);
}

}  // namespace

std::string format_parallel_groups(const WorldPlan& plan) {
  const int p = static_cast<int>(plan.parallel.sequence_parallel_size);
  const int t = static_cast<int>(plan.parallel.tensor_parallel_size);
  const int stages = static_cast<int>(plan.parallel.pipeline_parallel_size);
  const int e = static_cast<int>(plan.parallel.expert_parallel_size);
  if ((p <= 1 && t <= 1 && stages <= 1 && e <= 1) || plan.world_size % (p * t * stages) != 0 ||
      (plan.world_size / stages) % e != 0) {
    return "";
  }
  const layout::ParallelLayout l = layout::layout_of(plan.parallel, plan.world_size);
  using layout::Axis;
  const auto lines = [&](layout::Axes axes, const char* collectives, const char* label) {
    std::string out;
    const auto groups = groups_over(l, axes);
    for (size_t g = 0; g < groups.size(); ++g) {
      out += group_line(plan, static_cast<int>(g), groups[g], collectives, label);
    }
    return out;
  };
  std::string out;
  const int dp = l.size(Axis::kData);
  if (stages > 1) {
    // The outermost axis: each stage a block of consecutive ranks, each pipeline linking the ranks
    // at one place in every block.
    const int block = l.group_size(layout::kStage);
    out += fmt::format("pipeline stages: {} blocks of {} consecutive ranks{}:\n", stages, block,
                       plan.parallel.pipeline_virtual_stages > 1
                           ? fmt::format(", {} virtual stages per rank (interleaved 1F1B)",
                                         plan.parallel.pipeline_virtual_stages)
                           : std::string(" (") + plan.parallel.pipeline_schedule + ")");
    out += lines(layout::kStage, "collectives", "stage");
    out += fmt::format("pipelines of {} ranks {} apart:\n", stages, block);
    out += lines(Axis::kPipeline, "activations", "group");
  }
  if (t > 1) {
    out += fmt::format("tensor-parallel groups of {} consecutive ranks{}:\n", t,
                       plan.parallel.tensor_sequence_parallel
                           ? " (sequence parallelism between the layers' parallel regions)"
                           : "");
    out += lines(Axis::kTensor, "per-layer collectives", "group");
  }
  if (p > 1) {
    out += t == 1 ? fmt::format("sequence-parallel groups of {} consecutive ranks", p)
                  : fmt::format("sequence-parallel groups of {} ranks {} apart", p, t);
    out += fmt::format(" (data-parallel size {}):\n", dp);
    out += lines(Axis::kSequence, "all-to-alls", "group");
  }
  if (t > 1) {
    out += fmt::format(
        "data-parallel size {}: ZeRO shards each tensor-parallel slice{} over the {} ranks that "
        "hold it\n",
        dp, stages > 1 ? " of a stage" : "", l.group_size(layout::kSliceReplicas));
  } else if (stages > 1) {
    out += fmt::format("data-parallel size {}: ZeRO shards each stage over its {} ranks\n", dp,
                       l.group_size(layout::kSliceReplicas));
  }
  if (e > 1) {
    // The experts' own factorisation of each stage's ranks.
    const int ed = l.size(Axis::kExpertData);
    out += fmt::format(
        "expert-parallel groups of {} consecutive ranks, each holding 1/{} of every "
        "MoE layer's experts (tokens exchanged all-to-all):\n",
        e, e);
    out += lines(Axis::kExpert, "all-to-alls", "group");
    out += fmt::format(
        "expert-data-parallel size {}: ZeRO shards each rank's experts over the {} "
        "ranks that hold the same ones{}\n",
        ed, ed, ed > 1 ? fmt::format(" ({} apart)", e) : std::string());
  }
  return out;
}

void check_tensor_parallel_nodes(const WorldPlan& plan) {
  std::vector<int> ranks_per_node;
  std::vector<std::string> hosts;
  for (const RankSpec& rank : plan.ranks) {
    if (rank.node_rank >= static_cast<int>(ranks_per_node.size())) {
      ranks_per_node.push_back(0);
      hosts.push_back(rank.host);
    }
    ++ranks_per_node.back();
  }
  check_tensor_parallel_nodes(plan.parallel, ranks_per_node, hosts);
}

void check_tensor_parallel_nodes(const config::ParallelSection& parallel,
                                 const std::vector<int>& ranks_per_node,
                                 const std::vector<std::string>& hosts) {
  const int t = static_cast<int>(parallel.tensor_parallel_size);
  if (t <= 1 || parallel.tensor_parallel_across_nodes) return;
  std::vector<int> node_of;  // by rank
  for (size_t n = 0; n < ranks_per_node.size(); ++n) {
    node_of.insert(node_of.end(), static_cast<size_t>(ranks_per_node[n]), static_cast<int>(n));
  }
  for (size_t g = 0; (g + 1) * static_cast<size_t>(t) <= node_of.size(); ++g) {
    const size_t first = g * static_cast<size_t>(t), last = first + static_cast<size_t>(t) - 1;
    const int a = node_of[first], b = node_of[last];
    if (a == b) continue;
    fail(ErrorKind::kConfig,
         "parallel.tensor_parallel_size ({}): tensor-parallel group {} (ranks {}-{}) spans nodes "
         "{} ({}) and {} ({}): its collectives run at every layer and need one node's links; give "
         "each node a multiple of {} ranks, or set parallel.tensor_parallel_across_nodes: true",
         t, g, first, last, a, hosts.at(static_cast<size_t>(a)), b,
         hosts.at(static_cast<size_t>(b)), t);
  }
}

std::vector<RankSpec> ranks_on_node(const WorldPlan& plan, int node_rank) {
  std::vector<RankSpec> out;
  for (const RankSpec& rank : plan.ranks) {
    if (rank.node_rank == node_rank) out.push_back(rank);
  }
  return out;
}

}  // namespace dstrain::launcher
