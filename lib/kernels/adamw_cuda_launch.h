#pragma once
// Internal: the launcher compiled by nvcc. adamw_cuda.cpp validates arguments and turns the
// returned status into dstrain::Error, so the .cu file needs neither fmt nor exceptions.

#include <cuda_runtime_api.h>

#include "kernels/adamw_cuda.h"

namespace dstrain::kernels::detail {

// Enqueues the kernel (n > 0, pointers valid) and returns cudaGetLastError().
cudaError_t launch_adamw(const AdamWBuffers& buffers, const AdamWStep& step, cudaStream_t stream);

}  // namespace dstrain::kernels::detail
