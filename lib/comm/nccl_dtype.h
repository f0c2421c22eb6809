#pragma once
// torch::Tensor → NCCL argument mapping and the checks NcclCommunicator runs on every buffer.
// Pure functions (no device needed), so they are unit tested on machines without a GPU.

#include <nccl.h>
#include <torch/types.h>

#include "comm/communicator.h"

namespace dstrain::comm {

// float32, float64, bfloat16, float16 → the NCCL type; anything else is Error(kInternal) naming
// the collective and the dtype.
ncclDataType_t nccl_dtype(CollectiveKind kind, c10::ScalarType type);

// kSum → ncclSum, kAvg → ncclAvg (NCCL divides by the world size), kMax → ncclMax.
ncclRedOp_t nccl_op(ReduceOp op);

// A buffer must be a defined, contiguous, floating-point CUDA tensor on `device`; a CPU tensor (or
// one on another device) is Error(kInternal) "<collective>: <name> must be a contiguous CUDA
// tensor on device D, got a CPU tensor ...": the caller mixed up devices, a bug in dstrain.
void check_cuda_buffer(CollectiveKind kind, const char* name, const at::Tensor& t, int device);

}  // namespace dstrain::comm
