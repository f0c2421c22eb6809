#include "gpu_main.h"

#include <cstdio>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

namespace dstrain::testing {

int run_gpu_tests(int argc, char** argv) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    std::printf("skipped: no usable CUDA device (%s)\n",
                status == cudaSuccess ? "cudaGetDeviceCount found 0" : cudaGetErrorString(status));
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace dstrain::testing
