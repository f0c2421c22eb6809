#include "train/memory_limit.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#if DSTRAIN_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "comm/nccl_communicator.h"
#include "core/error.h"
#include "train/device.h"

namespace dstrain::train {
namespace {

// MemAvailable of /proc/meminfo in bytes.
int64_t host_available_memory() {
  constexpr const char* kMeminfo = "/proc/meminfo";
  std::ifstream in(kMeminfo);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  fail(ErrorKind::kRuntime,
       "cannot read MemAvailable from {}, which the auto micro-batch and checkpointing choices "
       "plan with on the CPU",
       kMeminfo);
}

}  // namespace

int64_t available_memory(const torch::Device& device) {
#if DSTRAIN_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard on_device(device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      fail(ErrorKind::kRuntime, "the run plan: cannot read the free memory of {}", device.str());
    }
    return static_cast<int64_t>(free);
  }
#endif
  (void)device;
  return host_available_memory();
}

int ranks_sharing_memory(const torch::Device& device) {
  return device.is_cuda() && !shares_one_gpu() ? 1 : local_world_size();
}

int64_t memory_per_rank(const torch::Device& device) {
  return std::min(available_memory(device) / ranks_sharing_memory(device),
                  memory_fraction_room(device));
}

int64_t planning_limit(comm::Communicator& comm, const torch::Device& device) {
  // The smallest limit of the ranks, as the largest negated one.
  torch::Tensor negated =
      torch::tensor({-static_cast<double>(memory_per_rank(device))},
                    torch::TensorOptions().dtype(torch::kDouble).device(device));
  // A host wait with the communicator's timeout: a rank that never arrives is an error here.
  if (comm.world_size() > 1) comm::synchronize(*comm.all_reduce(negated, comm::ReduceOp::kMax));
  return static_cast<int64_t>(-negated.item<double>() * kHeadroom);
}

}  // namespace dstrain::train
