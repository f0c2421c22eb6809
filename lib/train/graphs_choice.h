#pragma once
// training.cuda_graphs: whether a run records its decoder layers as CUDA graphs
// (model/layer_graphs.h), decided once when training starts, the same on every rank; and, while
// it trains, which layers every rank runs eagerly after one rank's fallback.
//
// Off on the CPU (graphs are CUDA's), and wherever a layer's work cannot be replayed as recorded:
// sequence parallelism (the attention exchanges slices with other ranks inside the layer), tiled
// MLP and selective checkpointing (they restore the RNG or keep tensors from one call for the next
// inside the layer), activation offload (host copies and events around each layer). `on` there
// warns that it has no effect.
//
// `auto` leaves them off (kAutoLeavesGraphsOff, in the start-up log): the memory their pools and
// gradient buffers hold is in no plan (`per_device_train_batch_size: auto`, `dstrain estimate`)
// and no rule says when a run is launch-bound enough to gain, so `on` is the user's explicit
// choice. At stage 3 graphs keep every unit's gathered parameters where they
// were recorded (the whole model in the compute dtype, zero::EngineOptions::keep_gathered_memory).

#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/layer_graphs.h"
#include "train/parallelize.h"

namespace dstrain::train {

inline constexpr std::string_view kAutoLeavesGraphsOff =
    "auto does not record them: the memory graphs keep is in no plan (per_device_train_batch_size: "
    "auto, dstrain estimate) and no rule yet says when a run gains from them "
    "(training.cuda_graphs: on records them)";

struct GraphsChoice {
  bool on = false;
  std::string why_not;  // when off: what keeps them off ("" when the setting is off)
};

// `plan`: the run's plan, its checkpointing resolved. `cuda`: the run's device is a GPU.
GraphsChoice choose_graphs(const config::Config& c, const ParallelPlan& plan, bool cuda);

// What in `plan` (with `sequence_parallel_size` ranks per sequence) keeps a layer's work from being
// replayed as recorded, "" when nothing does. parallelize() refuses graphs where this is not "".
std::string layer_graphs_blocker(const ParallelPlan& plan, int64_t sequence_parallel_size);

// A collective (every rank): each rank's fallbacks (`mine`, its LayerGraphs::take_fallbacks())
// gathered over `comm` on `device`; every layer that fell back on any rank runs eagerly on every
// rank from now on (LayerGraphs::run_eagerly), and rank 0 warns once per layer, naming the ranks
// and the cause. Returns those layers (block indices, ascending), the same on every rank.
// `blocks`: the model's block count (the same on every rank).
std::vector<size_t> agree_graph_fallbacks(comm::Communicator& comm, model::LayerGraphs& graphs,
                                          const std::vector<model::LayerFallback>& mine,
                                          size_t blocks, const torch::Device& device);

}  // namespace dstrain::train
