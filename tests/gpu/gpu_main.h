#pragma once
// main() of the GPU tests: without a usable CUDA device they print why and exit 77, which ctest
// reports as skipped (SKIP_RETURN_CODE 77), never as passed.

namespace dstrain::testing {

// Returns 77 when cudaGetDeviceCount fails or finds no device; else runs the gtests.
int run_gpu_tests(int argc, char** argv);

}  // namespace dstrain::testing
