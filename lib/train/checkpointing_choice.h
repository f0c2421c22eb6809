#pragma once
// model.gradient_checkpointing: auto, resolved when training starts: the fastest setting whose
// predicted peak fits the memory the rank has. Fastest first: no checkpointing (nothing is
// recomputed), then plain checkpointing (one extra forward of each layer), then offload (the same
// recompute plus copies of every layer input to the host and back, hidden behind compute only when
// a layer's work outlasts its copy). The peak predicted is the model states of the run's ZeRO stage
// (zero/estimate.h) plus the activations of one micro-batch (zero/estimate_activations.h).
//
// The limit: on a GPU the device memory free when the choice is made (before the model is placed
// on it), on the CPU the host's available memory (/proc/meminfo MemAvailable), divided among the
// ranks that share it (the CPU ranks of a host, the ranks of `--share-gpu`: LOCAL_WORLD_SIZE),
// times kHeadroom (what the estimate leaves out: allocator fragmentation and caching, library
// workspaces, communication buffers); the smallest over the ranks, so that every rank makes the
// same choice.
// When no setting is predicted to fit, the one with the smallest peak is taken and a warning says
// so: the prediction is an estimate, and the run either fits or stops at the allocator's
// out-of-memory error.
//
// The config keeps `auto` (config.yaml, a checkpoint's copy): a resumed run chooses again, for the
// memory and ranks it finds; the setting does not change the loss or the gradients.

#include <cstdint>
#include <string>

#include <torch/types.h>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/model_config.h"
#include "zero/estimate_activations.h"

namespace dstrain::train {

constexpr double kHeadroom = 0.9;

// Bytes this rank may fill on `device`, before kHeadroom: free device memory (CUDA) or the host's
// MemAvailable (CPU; Error(kRuntime) when /proc/meminfo cannot be read).
int64_t available_memory(const torch::Device& device);

// The ranks that share `device`'s memory: 1 on a GPU of its own, else LOCAL_WORLD_SIZE (the ranks
// of a host share its RAM; --share-gpu ranks one GPU).
int ranks_sharing_memory(const torch::Device& device);

// This rank's part of available_memory(): its ranks_sharing_memory()-th part, at most what
// DSTRAIN_CUDA_MEMORY_FRACTION leaves its allocator (memory_fraction_room(), device.h).
int64_t memory_per_rank(const torch::Device& device);

// Collective: the limit both auto choices (this one, micro_batch_auto.h) plan with, the smallest
// memory_per_rank() of the ranks times kHeadroom, so that every rank makes the same choice.
int64_t planning_limit(comm::Communicator& comm, const torch::Device& device);

// The choice for `config` (whose model.checkpoint_auto is set) on `world_size` ranks, with
// `limit` bytes per rank.
zero::CheckpointingChoice choose_for_run(const config::Config& config,
                                         const model::ModelConfig& model, int world_size, bool cuda,
                                         int64_t limit);

// choose_for_run() on `comm`'s ranks with `limit` (planning_limit()); rank 0 logs
// describe_choice() (a warning when nothing fits).
zero::CheckpointingChoice resolve_auto_checkpointing(const config::Config& config,
                                                     const model::ModelConfig& model,
                                                     comm::Communicator& comm,
                                                     const torch::Device& device, int64_t limit);

}  // namespace dstrain::train
