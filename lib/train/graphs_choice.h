#pragma once
// training.cuda_graphs: whether a run records its decoder layers as CUDA graphs
// (model/layer_graphs.h), decided once when training starts, the same on every rank; and, while
// it trains, which layers every rank runs eagerly after one rank's fallback.
//
// Off on the CPU (graphs are CUDA's), and wherever a layer's work cannot be replayed as recorded:
// sequence parallelism (the attention exchanges slices with other ranks inside the layer), tiled
// MLP and selective checkpointing (they restore the RNG or keep tensors from one call for the next
// inside the layer), activation offload (host copies and events around each layer); and packed
// documents (data.packing: documents): each batch's document boundaries set the attention's
// pieces, which a recording would replay as recorded. `on` there warns that it has no effect.
//
// `auto` records them where, besides, the run does not keep ZeRO stage 3's gathered parameters
// for them (at stage 3 graphs keep every unit's gathered parameters where they were recorded: the
// whole model in the compute dtype, zero::EngineOptions::keep_gathered_memory) and the memory
// model's peak with their buffers fits the rank's planning limit (their memory is taken from the
// room left, never from the micro-batch or checkpointing choices); and keeps them only where they
// pay: each recording is timed by its first-use check (model/layer_graphs.h), and when the replays
// were not kAutoMinSpeedup times faster than the eager runs on every rank, every layer runs eagerly
// from the second step on. `on` records them wherever they can run, whatever they cost.

#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/checkpointing.h"
#include "model/layer_graphs.h"

namespace dstrain::train {

// `auto` keeps the recordings where the first-use replays took at most 1/1.25 = 0.8 of the eager
// runs' time: below that the copies into and out of the recordings' buffers (not timed) and one
// timing per layer's noise could eat the gain, and the memory would be held for little.
inline constexpr double kAutoMinSpeedup = 1.25;

struct GraphsChoice {
  bool on = false;
  std::string why_not;     // when off: what keeps them off ("" when the setting is off)
  double min_speedup = 0;  // model::LayerGraphOptions::min_speedup (auto: kAutoMinSpeedup)
};

// What `auto` checks of the run's memory (per rank): the memory model's peak without graphs and
// with their buffers (estimate/activations.h) against the planning limit (memory_limit.h).
// limit 0: not checked.
struct GraphsMemory {
  int64_t peak = 0, peak_with_graphs = 0, limit = 0;
};

// `checkpointing`: the run's, resolved. `cuda`: the run's device is a GPU. `experts`: the model
// has Mixture-of-Experts layers (never recorded).
GraphsChoice choose_graphs(const config::Config& c, model::Checkpointing checkpointing, bool cuda,
                           const GraphsMemory& memory = {}, bool experts = false);

// What keeps a layer's work from being replayed as recorded under `checkpointing`, `tiled_mlp`
// and `sequence_parallel_size` ranks per sequence, "" when nothing does. parallelize() refuses
// graphs where this is not "".
std::string layer_graphs_blocker(model::Checkpointing checkpointing, int64_t tiled_mlp,
                                 int64_t sequence_parallel_size);

// A collective (every rank): each rank's fallbacks (`mine`, its LayerGraphs::take_fallbacks())
// gathered over `comm` on `device`; every layer that fell back on any rank runs eagerly on every
// rank from now on (LayerGraphs::run_eagerly), and rank 0 warns once per layer, naming the ranks
// and the cause. Returns those layers (block indices, ascending), the same on every rank.
// `blocks`: the model's block count (the same on every rank).
std::vector<size_t> agree_graph_fallbacks(comm::Communicator& comm, model::LayerGraphs& graphs,
                                          const std::vector<model::LayerFallback>& mine,
                                          size_t blocks, const torch::Device& device);

}  // namespace dstrain::train
