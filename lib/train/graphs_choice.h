#pragma once
// training.cuda_graphs: whether a run records its decoder layers as CUDA graphs
// (model/layer_graphs.h), decided once when training starts, the same on every rank.
//
// Off on the CPU (graphs are CUDA's), and wherever a layer's work cannot be replayed as recorded:
// sequence parallelism (the attention exchanges slices with other ranks inside the layer), tiled
// MLP and selective checkpointing (they restore the RNG or keep tensors from one call for the next
// inside the layer), activation offload (host copies and events around each layer). `on` there
// warns that it has no effect; `auto` says why it is off in the start-up log.
//
// Stage 3 keeps every unit's gathered parameters where graphs recorded them (the whole model in
// the compute dtype, zero::EngineOptions::keep_gathered_memory): `auto` takes graphs at stage 3
// only when that is at most 1/kStage3Share of the memory the rank plans with; `on` takes them
// regardless.

#include <cstdint>
#include <string>

#include "config/config.h"
#include "train/parallelize.h"

namespace dstrain::train {

constexpr int64_t kStage3Share = 8;

struct GraphsChoice {
  bool on = false;
  std::string why_not;  // when off: what keeps them off ("" when the setting is off)
};

// `plan`: the run's plan, its checkpointing resolved. `cuda`: the run's device is a GPU.
// `gathered_bytes`: the model's parameters in the compute dtype; `limit`: the bytes per rank the
// run plans with (planning_limit()); both read only at stage 3 with auto.
GraphsChoice choose_graphs(const config::Config& c, const ParallelPlan& plan, bool cuda,
                           int64_t gathered_bytes, int64_t limit);

// Whether choose_graphs() will read `limit` for `c` (a collective to compute: every rank asks).
bool graphs_need_limit(const config::Config& c, bool cuda);

// What in `plan` (with `sequence_parallel_size` ranks per sequence) keeps a layer's work from being
// replayed as recorded, "" when nothing does. parallelize() refuses graphs where this is not "".
std::string layer_graphs_blocker(const ParallelPlan& plan, int64_t sequence_parallel_size);

}  // namespace dstrain::train
