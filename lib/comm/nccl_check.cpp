#include "comm/nccl_check.h"

#include <cerrno>
#include <cstdlib>

namespace dstrain::comm {

void check_cuda(cudaError_t status, int rank, const std::string& what, ErrorKind kind) {
  if (status == cudaSuccess) return;
  fail(kind, "rank {}: {}: {} ({})", rank, what, cudaGetErrorString(status),
       cudaGetErrorName(status));
}

void check_nccl(ncclResult_t status, int rank, const std::string& what) {
  if (status == ncclSuccess || status == ncclInProgress) return;
  const char* last = ncclGetLastError(nullptr);
  fail(ErrorKind::kComm, "rank {}: {}: {}{}{}", rank, what, ncclGetErrorString(status),
       last && *last ? ": " : "", last ? last : "");
}

int cuda_device_count() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" state for later callers
    fail(ErrorKind::kRuntime,
         "no CUDA device is usable on this machine ({}); the NCCL communicator needs one GPU per "
         "rank",
         status == cudaSuccess ? "cudaGetDeviceCount found 0 devices" : cudaGetErrorString(status));
  }
  return count;
}

int pick_device(int requested, int device_count) {
  if (requested >= 0) {
    if (requested >= device_count) {
      fail(ErrorKind::kUsage, "CUDA device {} was requested but this machine has {}", requested,
           device_count);
    }
    return requested;
  }
  const char* text = std::getenv("LOCAL_RANK");
  if (text == nullptr || *text == '\0') return 0;
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < 0 || value >= device_count) {
    fail(ErrorKind::kUsage,
         "environment variable LOCAL_RANK='{}' must be an integer in [0, {}) (one CUDA device per "
         "local rank; this machine has {})",
         text, device_count, device_count);
  }
  return static_cast<int>(value);
}

double to_seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

}  // namespace dstrain::comm
