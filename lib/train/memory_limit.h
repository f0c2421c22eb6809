#pragma once
// The memory a rank plans with: what the auto choices of the run plan (run_plan.h: micro-batch,
// gradient checkpointing, CUDA graphs) fit their predicted peaks into.
//
// On a GPU the device memory free when the plan is made (before the model is placed on it), on
// the CPU the host's available memory (/proc/meminfo MemAvailable), divided among the ranks that
// share it (the CPU ranks of a host, the ranks of `--share-gpu`: LOCAL_WORLD_SIZE), times
// kHeadroom (what the estimate leaves out: allocator fragmentation and caching, library
// workspaces, communication buffers); the smallest over the ranks, so that every rank makes the
// same choices.

#include <cstdint>

#include <torch/types.h>

#include "comm/communicator.h"

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

// Collective: the limit the run plan's auto choices plan with, the smallest memory_per_rank() of
// the ranks times kHeadroom, so that every rank makes the same choices.
int64_t planning_limit(comm::Communicator& comm, const torch::Device& device);

}  // namespace dstrain::train
