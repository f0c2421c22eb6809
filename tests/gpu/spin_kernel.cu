#include "spin_kernel.h"

namespace dstrain::testing {
namespace {

__global__ void spin_until_flag(volatile int* flag) {
  while (*flag == 0) {
    __nanosleep(1000);
  }
}

}  // namespace

void launch_spin_until_flag(volatile int* flag, cudaStream_t stream) {
  spin_until_flag<<<1, 1, 0, stream>>>(flag);
}

}  // namespace dstrain::testing
