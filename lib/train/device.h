#pragma once
// Where a rank computes, and what follows from it: the communicator and device memory figures.
//
// The device is cuda:LOCAL_RANK when LibTorch has CUDA and a device is visible, else the CPU.
// DSTRAIN_DEVICE overrides: "cpu" forces the CPU; "cuda" makes a missing device an error
// (Error(kUsage), exit 2) instead of a silent CPU run. DSTRAIN_SHARE_GPU=1 (`dstrain launch
// --share-gpu`, launcher/launch_local.h) puts every rank on cuda:0 whatever its LOCAL_RANK. A CUDA
// rank talks NCCL; a CPU rank Gloo.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "comm/communicator.h"

namespace dstrain::train {

// DSTRAIN_SHARE_GPU=1 in the environment; Error(kUsage) for a value other than 0, 1 or empty.
bool shares_one_gpu();

// LOCAL_WORLD_SIZE, the ranks of this host (1 when unset); Error(kUsage) naming the variable for a
// value that is not a positive integer.
int local_world_size();

// DSTRAIN_CUDA_MEMORY_FRACTION: the share of a GPU's memory the CUDA caching allocator of this
// process may hold (torch.cuda.set_per_process_memory_fraction), 0 when unset or empty (no limit).
// Error(kUsage) naming the variable for a value that is not a number in (0, 1].
double cuda_memory_fraction();

// Applies cuda_memory_fraction() to `device`'s caching allocator: beyond it an allocation fails
// with CUDA's out-of-memory error, as if the GPU were that small. A warning, and nothing else, on
// the CPU and in CPU-only builds.
void limit_device_memory(const torch::Device& device);

// What `device`'s caching allocator may still reserve under cuda_memory_fraction(): the fraction
// of the device's memory less what it holds already; the largest int64_t without a fraction or off
// a CUDA device (the planners of the auto settings take the smaller of this and the free memory).
int64_t memory_fraction_room(const torch::Device& device);

// NVIDIA GPUs the driver lists (the entries of `driver_dir`, /proc/driver/nvidia/gpus), whatever
// this build can do with them; 0 without the driver.
int nvidia_gpus_listed(const std::string& driver_dir = "/proc/driver/nvidia/gpus");

// `local_rank`: LOCAL_RANK of this process (selects the GPU unless shares_one_gpu()). Error(kUsage)
// for a DSTRAIN_DEVICE other than cpu/cuda, or cuda without a visible device (or with LOCAL_RANK >=
// device count). In a build without CUDA (DSTRAIN_CUDA off) on a node whose driver lists GPUs,
// Error(kNotImplemented) unless DSTRAIN_DEVICE=cpu: a rank never trains on the CPU of a GPU node
// without being asked to.
torch::Device select_device(int local_rank);

// What `ranks` ranks of this node would compute on, as one line: "LibTorch 2.11.0; 8 CUDA
// device(s): NVIDIA H200 (139.8 GiB)" or "LibTorch 2.11.0; no CUDA device: the ranks compute on
// the CPU". Throws what select_device() throws for any of LOCAL_RANK 0..ranks-1 (a rank without
// a GPU, a build without CUDA on a GPU node). `dstrain launch --dry-run --check` runs it on every
// host (`dstrain debug devices`).
std::string describe_devices(int ranks);

// NCCL on `device` for a CUDA device, Gloo otherwise.
std::unique_ptr<comm::Communicator> make_communicator(const comm::RendezvousOptions& options,
                                                      const torch::Device& device);

// Where a rank runs: its place in the world, its device and the communicator over every rank. The
// trainer is given one, so that tests can give it an in-memory communicator.
struct World {
  int rank = 0;
  int size = 1;
  torch::Device device{torch::kCPU};
  std::unique_ptr<comm::Communicator> comm;
};

// The world of the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): the
// rendezvous, select_device(), limit_device_memory(), make_communicator().
World join_world_from_env();

// Device memory for metrics.jsonl, in MB: memory/allocated_mb, memory/peak_allocated_mb,
// memory/reserved_mb (torch.cuda's memory_allocated / max_memory_allocated / memory_reserved).
// Read from the CUDA caching allocator, which only a CUDA LibTorch (DSTRAIN_CUDA) has: empty on
// the CPU and in CPU-only builds.
std::vector<std::pair<std::string, double>> device_memory_metrics(const torch::Device& device);

}  // namespace dstrain::train
