#include "train/device.h"

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include <torch/cuda.h>
#include <torch/version.h>

#if DSTRAIN_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include "comm/gloo_communicator.h"
#include "comm/nccl_communicator.h"
#include "core/error.h"
#include "core/log.h"

namespace dstrain::train {

bool shares_one_gpu() {
  const char* env = std::getenv("DSTRAIN_SHARE_GPU");
  const std::string value = env ? env : "";
  if (value != "" && value != "0" && value != "1")
    fail(ErrorKind::kUsage, "environment variable DSTRAIN_SHARE_GPU='{}': expected 0 or 1", value);
  return value == "1";
}

int local_world_size() {
  const char* env = std::getenv("LOCAL_WORLD_SIZE");
  if (env == nullptr || *env == '\0') return 1;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(env, &end, 10);
  if (*end != '\0' || errno == ERANGE || value < 1 || value > std::numeric_limits<int>::max()) {
    fail(ErrorKind::kUsage,
         "environment variable LOCAL_WORLD_SIZE='{}': expected a positive integer", env);
  }
  return static_cast<int>(value);
}

double cuda_memory_fraction() {
  const char* env = std::getenv("DSTRAIN_CUDA_MEMORY_FRACTION");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(env, &end);
  // !(value > 0) also refuses NaN.
  if (*end != '\0' || errno == ERANGE || !(value > 0) || value > 1) {
    fail(ErrorKind::kUsage,
         "environment variable DSTRAIN_CUDA_MEMORY_FRACTION='{}': expected a number greater than "
         "0 and at most 1 (the share of the GPU's memory this process may allocate)",
         env);
  }
  return value;
}

void limit_device_memory(const torch::Device& device) {
  const double fraction = cuda_memory_fraction();
  if (fraction == 0) return;
#if DSTRAIN_CUDA
  if (device.is_cuda()) {
    // The allocator exists per device only once CUDA is initialised; before that it refuses.
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, device.index());
    log::info("DSTRAIN_CUDA_MEMORY_FRACTION={}: the caching allocator may hold {:.0f}% of {}",
              fraction, fraction * 100, device.str());
    return;
  }
#endif
  log::warn("DSTRAIN_CUDA_MEMORY_FRACTION={} has no effect: this rank computes on {}", fraction,
            device.str());
}

int64_t memory_fraction_room(const torch::Device& device) {
  const double fraction = cuda_memory_fraction();
#if DSTRAIN_CUDA
  if (fraction > 0 && device.is_cuda()) {
    const c10::cuda::CUDAGuard on_device(device);
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      fail(ErrorKind::kRuntime, "cannot read the memory size of {}", device.str());
    }
    constexpr size_t kAggregate = 0;  // StatType::AGGREGATE
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    // The allocator refuses once what it reserves would pass fraction × total.
    return static_cast<int64_t>(fraction * static_cast<double>(total)) -
           stats.reserved_bytes[kAggregate].current;
  }
#endif
  (void)device;
  (void)fraction;
  return std::numeric_limits<int64_t>::max();
}

int nvidia_gpus_listed(const std::string& driver_dir) {
  std::error_code error;
  int n = 0;
  for (std::filesystem::directory_iterator it(driver_dir, error), end; !error && it != end;
       it.increment(error)) {
    ++n;
  }
  return n;
}

torch::Device select_device(int local_rank) {
  const char* env = std::getenv("DSTRAIN_DEVICE");
  const std::string want = env ? env : "";
  if (!want.empty() && want != "cpu" && want != "cuda") {
    fail(ErrorKind::kUsage, "DSTRAIN_DEVICE='{}': expected cpu or cuda", want);
  }
  if (want == "cpu") return torch::Device(torch::kCPU);
#if !DSTRAIN_CUDA
  if (const int gpus = nvidia_gpus_listed(); gpus > 0) {
    fail(ErrorKind::kNotImplemented,
         "this node has {} NVIDIA GPU(s), but this dstrain was built without CUDA (configure "
         "found no CUDA toolkit, or the LibTorch is CPU-only): rebuild with the CUDA toolkit "
         "(docs/gpu.md), or set DSTRAIN_DEVICE=cpu to train on the CPU",
         gpus);
  }
#endif
  const int64_t count = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
  if (count == 0) {
    if (want == "cuda") {
      fail(ErrorKind::kUsage,
           "DSTRAIN_DEVICE=cuda but no CUDA device is visible to this build (LibTorch has CUDA: "
           "{})",
           torch::cuda::is_available() ? "yes" : "no");
    }
    return torch::Device(torch::kCPU);
  }
  if (shares_one_gpu()) return torch::Device(torch::kCUDA, 0);
  if (local_rank < 0 || local_rank >= count) {
    fail(ErrorKind::kUsage,
         "LOCAL_RANK {} has no GPU: {} device(s) are visible; launch at most {} ranks per node",
         local_rank, count, count);
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

std::string describe_devices(int ranks) {
  torch::Device device(torch::kCPU);
  for (int r = 0; r < ranks; ++r) device = select_device(r);
  std::string line = "LibTorch " TORCH_VERSION "; ";
  if (!device.is_cuda()) return line + "no CUDA device: the ranks compute on the CPU";
  const int64_t count = torch::cuda::device_count();
  line += fmt::format("{} CUDA device(s)", count);
#if DSTRAIN_CUDA
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) {
    line +=
        fmt::format(": {} ({:.1f} GiB)", p.name, static_cast<double>(p.totalGlobalMem) / (1 << 30));
  }
#endif
  return line;
}

std::unique_ptr<comm::Communicator> make_communicator(const comm::RendezvousOptions& options,
                                                      const torch::Device& device) {
  if (!device.is_cuda()) return comm::make_gloo_communicator(options);
  comm::NcclCommunicatorOptions nccl;
  nccl.device = device.index();
  return comm::make_nccl_communicator(options, nccl);
}

std::vector<std::pair<std::string, double>> device_memory_metrics(const torch::Device& device) {
  std::vector<std::pair<std::string, double>> out;
#if DSTRAIN_CUDA
  if (device.is_cuda()) {
    using c10::cuda::CUDACachingAllocator::getDeviceStats;
    const auto stats = getDeviceStats(device.index());
    constexpr size_t kAggregate = 0;  // StatType::AGGREGATE
    out.emplace_back("memory/allocated_mb",
                     static_cast<double>(stats.allocated_bytes[kAggregate].current) / 1e6);
    out.emplace_back("memory/peak_allocated_mb",
                     static_cast<double>(stats.allocated_bytes[kAggregate].peak) / 1e6);
    out.emplace_back("memory/reserved_mb",
                     static_cast<double>(stats.reserved_bytes[kAggregate].current) / 1e6);
  }
#else
  (void)device;
#endif
  return out;
}

World join_world_from_env() {
  const comm::RendezvousOptions ro = comm::rendezvous_options_from_env();
  World w;
  w.rank = ro.rank;
  w.size = ro.world_size;
  log::set_rank(w.rank);
  int local_rank = 0;
  if (const char* v = std::getenv("LOCAL_RANK")) local_rank = std::atoi(v);
  w.device = select_device(local_rank);
  limit_device_memory(w.device);
  w.comm = make_communicator(ro, w.device);
  log::info("dstrain: {} rank(s), rendezvous at {}:{} done, device {}", w.size, ro.master_addr,
            ro.master_port, w.device.str());
  return w;
}

}  // namespace dstrain::train
