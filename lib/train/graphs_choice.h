#pragma once
// training.cuda_graphs: whether a run records its decoder layers as CUDA graphs
// (model/layer_graphs.h), decided once when training starts, the same on every rank.
//
// Off on the CPU (graphs are CUDA's), and wherever a layer's work cannot be replayed as recorded:
// sequence parallelism (the attention exchanges slices with other ranks inside the layer), tiled
// MLP and selective checkpointing (they restore the RNG or keep tensors from one call for the next
// inside the layer), activation offload (host copies and events around each layer). `on` there
// warns that it has no effect.
//
// `auto` leaves them off (kAutoLeavesGraphsOff, in the start-up log): a recording is not compared
// with the eager step it replaces on the card it runs on, and the memory its pools and gradient
// buffers hold is in no plan (`per_device_train_batch_size: auto`, `dstrain estimate`), so `on` is
// the user's explicit choice. At stage 3 graphs keep every unit's gathered parameters where they
// were recorded (the whole model in the compute dtype, zero::EngineOptions::keep_gathered_memory).

#include <string_view>

#include "config/config.h"
#include "train/parallelize.h"

namespace dstrain::train {

inline constexpr std::string_view kAutoLeavesGraphsOff =
    "auto does not record them: a replay is not yet checked against the eager step on the card, "
    "and the memory graphs keep is in no plan (training.cuda_graphs: on records them)";

struct GraphsChoice {
  bool on = false;
  std::string why_not;  // when off: what keeps them off ("" when the setting is off)
};

// `plan`: the run's plan, its checkpointing resolved. `cuda`: the run's device is a GPU.
GraphsChoice choose_graphs(const config::Config& c, const ParallelPlan& plan, bool cuda);

// What in `plan` (with `sequence_parallel_size` ranks per sequence) keeps a layer's work from being
// replayed as recorded, "" when nothing does. parallelize() refuses graphs where this is not "".
std::string layer_graphs_blocker(const ParallelPlan& plan, int64_t sequence_parallel_size);

}  // namespace dstrain::train
