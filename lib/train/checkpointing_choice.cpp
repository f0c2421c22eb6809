#include "train/checkpointing_choice.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#if DSTRAIN_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "comm/nccl_communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "train/device.h"
#include "zero/estimate.h"

namespace dstrain::train {
namespace {

// MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read.
int64_t host_available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace

int64_t available_memory(const torch::Device& device) {
#if DSTRAIN_CUDA
  if (device.is_cuda()) {
    const c10::cuda::CUDAGuard on_device(device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      fail(ErrorKind::kRuntime, "gradient_checkpointing: auto: cannot read the free memory of {}",
           device.str());
    }
    return static_cast<int64_t>(free);
  }
#endif
  (void)device;
  return host_available_memory();
}

int64_t memory_per_rank(const torch::Device& device) {
  const int64_t bytes = available_memory(device);
  if (device.is_cuda() && !shares_one_gpu()) return bytes;
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  return bytes / std::max(1, local != nullptr ? std::atoi(local) : 1);
}

zero::CheckpointingChoice choose_for_run(const config::Config& config,
                                         const model::ModelConfig& model, int world_size, bool cuda,
                                         int64_t limit) {
  const zero::EstimateRow states = zero::estimate_row(
      zero::estimate_input(config, model, world_size), static_cast<int>(config.zero.stage),
      config.zero.offload_optimizer.device == "cpu", config.zero.offload_param.device == "cpu");
  const zero::ActivationInput activations = zero::activation_input(config, model, cuda);
  return zero::choose_checkpointing(zero::activation_rows(activations), states.device(), limit);
}

zero::CheckpointingChoice resolve_auto_checkpointing(const config::Config& config,
                                                     const model::ModelConfig& model,
                                                     comm::Communicator& comm,
                                                     const torch::Device& device) {
  // The smallest limit of the ranks, as the largest negated one.
  torch::Tensor negated =
      torch::tensor({-static_cast<double>(memory_per_rank(device))},
                    torch::TensorOptions().dtype(torch::kDouble).device(device));
  // A host wait with the communicator's timeout: a rank that never arrives is an error here.
  if (comm.world_size() > 1) comm::synchronize(*comm.all_reduce(negated, comm::ReduceOp::kMax));
  const auto limit = static_cast<int64_t>(-negated.item<double>() * kHeadroom);
  const zero::CheckpointingChoice choice =
      choose_for_run(config, model, comm.world_size(), device.is_cuda(), limit);
  if (comm.rank() == 0) {
    if (choice.fits) {
      log::info("{}", zero::describe_choice(choice));
    } else {
      log::warn("{}", zero::describe_choice(choice));
    }
  }
  return choice;
}

}  // namespace dstrain::train
