#pragma once
// Error plumbing shared by the NCCL code: CUDA and NCCL status codes become dstrain::Error with a
// message that says what was being done, on which rank. Internal to lib/comm (needs CUDA headers).

#include <chrono>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/error.h"

namespace dstrain::comm {

// Throws Error(kind) "rank R: <what>: <cudaGetErrorString>" unless status is cudaSuccess.
void check_cuda(cudaError_t status, int rank, const std::string& what,
                ErrorKind kind = ErrorKind::kRuntime);

// Throws Error(kComm) "rank R: <what>: <ncclGetErrorString> (<ncclGetLastError>)" unless status is
// ncclSuccess or ncclInProgress (non-blocking communicators answer that while work is queued).
void check_nccl(ncclResult_t status, int rank, const std::string& what);

// Number of visible CUDA devices. Throws Error(kRuntime) "no CUDA device ..." when there is none or
// the driver cannot be reached (e.g. a build machine with the toolkit but no GPU).
int cuda_device_count();

// The device this rank drives: `requested` when >= 0, else LOCAL_RANK (default 0). Throws
// Error(kUsage) naming LOCAL_RANK when it is malformed or not below the device count.
int pick_device(int requested, int device_count);

double to_seconds(std::chrono::milliseconds ms);

}  // namespace dstrain::comm
