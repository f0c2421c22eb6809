#pragma once
// Test helper: a kernel that holds a stream until the host writes a non-zero flag, to make a
// collective wait past its timeout.

#include <cuda_runtime_api.h>

namespace dstrain::testing {

// flag: host-mapped memory (cudaHostAlloc with cudaHostAllocMapped), device view.
void launch_spin_until_flag(volatile int* flag, cudaStream_t stream);

}  // namespace dstrain::testing
