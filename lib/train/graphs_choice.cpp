#include "train/graphs_choice.h"

#include <map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/bytes.h"
#include "core/log.h"
#include "train/step_sync.h"

namespace dstrain::train {

std::string layer_graphs_blocker(model::Checkpointing checkpointing, int64_t tiled_mlp,
                                 int64_t sequence_parallel_size) {
  if (sequence_parallel_size > 1) {
    return "with sequence parallelism each layer's attention exchanges slices with other ranks";
  }
  if (tiled_mlp != 0) return "model.tiled_mlp restores the RNG inside each layer";
  if (checkpointing == model::Checkpointing::kSelective) {
    return "selective checkpointing keeps each layer's attention from one call for the next";
  }
  if (checkpointing == model::Checkpointing::kOffload) {
    return "offloaded checkpointing copies each layer's input to the host";
  }
  return "";
}

GraphsChoice choose_graphs(const config::Config& c, model::Checkpointing checkpointing, bool cuda,
                           const GraphsMemory& memory, bool experts) {
  GraphsChoice g;
  if (c.training.cuda_graphs == "off") return g;
  const bool automatic = c.training.cuda_graphs == "auto";
  const std::string blocker =
      layer_graphs_blocker(checkpointing, c.model.tiled_mlp, c.parallel.sequence_parallel_size);
  if (!cuda) {
    g.why_not = "the run is on the CPU; CUDA graphs need a GPU";
  } else if (c.parallel.tensor_parallel_size > 1) {
    g.why_not =
        "with tensor parallelism each layer's collectives run on the tensor-parallel group, which "
        "a recorded layer does not replay";
  } else if (c.parallel.pipeline_parallel_size > 1) {
    g.why_not =
        "with pipeline parallelism a stage's layers run between transfers from the other stages, "
        "and they run eagerly";
  } else if (experts) {
    g.why_not =
        "a Mixture-of-Experts layer sends each batch's tokens to the experts its router picks "
        "(shapes that change from batch to batch), which a recorded layer does not replay";
  } else if (!blocker.empty()) {
    g.why_not = blocker;
  } else if (c.data.packing == "documents") {
    g.why_not =
        "with data.packing: documents every batch has its own document boundaries, and a recorded "
        "layer replays the attention of the boundaries it was recorded with (data.packing: "
        "stream or pad keeps graphs)";
  } else if (automatic && c.zero.stage == 3) {
    g.why_not =
        "at ZeRO stage 3 graphs keep every layer's gathered parameters (the whole model in the "
        "compute dtype on each GPU), and auto does not spend stage 3's savings on them "
        "(training.cuda_graphs: on does)";
  } else if (automatic && memory.limit > 0 && memory.peak_with_graphs > memory.limit) {
    g.why_not = fmt::format(
        "their buffers would take the memory model's peak per rank from {} to {}, over the {} "
        "planned (training.cuda_graphs: on records them anyway, up to that model's figure)",
        human_bytes(memory.peak), human_bytes(memory.peak_with_graphs), human_bytes(memory.limit));
  }
  g.on = g.why_not.empty();
  if (g.on && automatic) g.min_speedup = kAutoMinSpeedup;
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
  // kNoGain concerns every layer: one line for all of them, with each such rank's replay seconds
  // and the most that would pay (the same on all its layers).
  std::map<int, std::pair<double, double>> no_gain;
  for (int64_t b = 0; b < n; ++b) {
    std::vector<int> ranks;
    for (int r = 0; r < world; ++r) {
      const auto cause = static_cast<model::FallbackCause>(all[r][b][0].item<int>());
      if (cause == model::FallbackCause::kNoGain) {
        no_gain.try_emplace(r, all[r][b][1].item<double>(), all[r][b][2].item<double>());
      }
      if (static_cast<int>(cause) != 0) ranks.push_back(r);
    }
    if (ranks.empty()) continue;
    layers.push_back(static_cast<size_t>(b));
    const auto first = all[ranks[0]][b];
    const auto cause = static_cast<model::FallbackCause>(first[0].item<int>());
    if (comm.rank() != 0 || cause == model::FallbackCause::kNoGain) continue;
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
  if (comm.rank() == 0 && !no_gain.empty()) {
    std::vector<int> ranks;
    for (const auto& [r, seconds] : no_gain) ranks.push_back(r);
    const auto [replay, allowed] = no_gain.begin()->second;
    log::info(
        "CUDA graphs off from the next step: on rank(s) {} the layers' replays took {:.3g} ms, "
        "over the {:.3g} ms that would pay (first use, all layers: their eager runs' time over the "
        "speedup required); the run is not held back by kernel launches "
        "(training.cuda_graphs: on keeps them)",
        fmt::join(ranks, ", "), replay * 1e3, allowed * 1e3);
  }
  graphs.run_eagerly(layers);
  return layers;
}

}  // namespace dstrain::train
