#include "train/graphs_choice.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/log.h"
#include "train/step_sync.h"

namespace dstrain::train {

std::string layer_graphs_blocker(const ParallelPlan& plan, int64_t sequence_parallel_size) {
  if (sequence_parallel_size > 1) {
    return "with sequence parallelism each layer's attention exchanges slices with other ranks";
  }
  if (plan.tiled_mlp != 0) return "model.tiled_mlp restores the RNG inside each layer";
  if (plan.checkpointing && plan.checkpoint_selective) {
    return "selective checkpointing keeps each layer's attention from one call for the next";
  }
  if (plan.checkpointing && plan.checkpoint_offload) {
    return "offloaded checkpointing copies each layer's input to the host";
  }
  return "";
}

GraphsChoice choose_graphs(const config::Config& c, const ParallelPlan& plan, bool cuda) {
  GraphsChoice g;
  if (c.training.cuda_graphs == "off") return g;
  const std::string blocker = layer_graphs_blocker(plan, c.parallel.sequence_parallel_size);
  if (!cuda) {
    g.why_not = "the run is on the CPU; CUDA graphs need a GPU";
  } else if (!blocker.empty()) {
    g.why_not = blocker;
  } else if (c.training.cuda_graphs == "auto") {
    g.why_not = std::string(kAutoLeavesGraphsOff);
  }
  g.on = g.why_not.empty();
  return g;
}

std::vector<size_t> agree_graph_fallbacks(comm::Communicator& comm, model::LayerGraphs& graphs,
                                          const std::vector<model::LayerFallback>& mine,
                                          size_t blocks, const torch::Device& device) {
  constexpr int64_t kFields = 3;  // cause (0: none), error, bound
  const auto n = static_cast<int64_t>(blocks);
  torch::Tensor local = torch::zeros({n, kFields}, torch::kDouble);
  for (const model::LayerFallback& f : mine) {
    if (static_cast<int64_t>(f.layer) >= n) continue;
    local[f.layer][0] = static_cast<double>(f.cause);
    local[f.layer][1] = f.error;
    local[f.layer][2] = f.bound;
  }
  const int world = comm.world_size();
  const torch::Tensor all = gather_from_ranks(comm, local, device);
  std::vector<size_t> layers;
  for (int64_t b = 0; b < n; ++b) {
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r) {
      if (all[r][b][0].item<double>() != 0) ranks.push_back(r);
    }
    if (ranks.empty()) continue;
    layers.push_back(static_cast<size_t>(b));
    if (comm.rank() != 0) continue;
    const auto first = all[ranks[0]][b];
    const auto cause = static_cast<model::FallbackCause>(first[0].item<int>());
    std::string detail;
    for (const model::LayerFallback& f : mine) {
      if (ranks[0] == 0 && f.layer == static_cast<size_t>(b)) detail = f.detail;
    }
    std::string numbers;
    if (cause == model::FallbackCause::kReplayDiffers) {
      numbers = fmt::format(": max |replay - eager| {:.3g}{} against a bound of {:.3g}",
                            first[1].item<double>(), detail.empty() ? "" : " (" + detail + ")",
                            first[2].item<double>());
    } else if (!detail.empty()) {
      numbers = " (" + detail + ")";
    }
    log::warn("CUDA graphs: {} runs eagerly on every rank from the next step: on rank(s) {} {}{}",
              graphs.block_name(static_cast<size_t>(b)), fmt::join(ranks, ", "),
              model::fallback_cause_text(cause), numbers);
  }
  graphs.run_eagerly(layers);
  return layers;
}

}  // namespace dstrain::train
