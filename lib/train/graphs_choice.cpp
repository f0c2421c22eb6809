#include "train/graphs_choice.h"

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

}  // namespace dstrain::train
