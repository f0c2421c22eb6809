// The NCCL watchdog: a wait that cannot finish ends in Error(kTimeout) naming the rank, the
// collective and the timeout, with the communicator aborted, instead of a hang. A binary of its
// own, so an aborted communicator cannot disturb the other GPU tests.

#include <chrono>
#include <string>
#include <thread>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "comm/nccl_group.h"
#include "core/error.h"
#include "spin_kernel.h"

namespace dstrain::comm {
namespace {

using std::chrono::seconds;

TEST(NcclWatchdog, InitWithAPeerThatNeverJoinsTimesOut) {
  NcclGroupOptions options;
  options.rank = 0;
  options.world_size = 2;  // rank 1 never comes
  options.timeout = seconds(3);
  const auto start = std::chrono::steady_clock::now();
  try {
    NcclGroup group(NcclGroup::new_unique_id(), options);
    FAIL() << "init of a world of two with one rank succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("3 s"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(60)) << "the watchdog did not fire";
}

TEST(NcclWatchdog, CollectiveHeldPastTheTimeoutThrowsAndAborts) {
  NcclGroupOptions options;
  options.timeout = seconds(2);
  NcclGroup group(NcclGroup::new_unique_id(), options);
  int* flag = nullptr;
  ASSERT_EQ(cudaHostAlloc(&flag, sizeof(int), cudaHostAllocMapped), cudaSuccess);
  *flag = 0;
  int* device_flag = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&device_flag, flag, 0), cudaSuccess);
  cudaStream_t compute;
  ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
  float* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 256 * sizeof(float)), cudaSuccess);

  // The spinning kernel holds the compute stream, so the collective queued behind it cannot
  // finish. ncclCommAbort may wait for the kernels on the device (it frees device memory), the
  // spinning one included: the first H100 run, which released it only after the abort, hung. A
  // thread releases it 1.5 s after the watchdog's 2 s, as a peer's death ends a real NCCL wait.
  std::thread release([flag] {
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
  });
  testing::launch_spin_until_flag(device_flag, compute);
  auto work = group.all_reduce(buffer, 256, ncclFloat32, ncclSum, compute);
  const auto start = std::chrono::steady_clock::now();
  try {
    work->synchronize();
    ADD_FAILURE() << "a collective behind a held stream completed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2 s"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20)) << "the watchdog did not fire";
  try {
    group.all_reduce(buffer, 256, ncclFloat32, ncclSum, compute);
    ADD_FAILURE() << "an aborted communicator accepted a collective";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kComm) << e.what();
  }
  release.join();
  EXPECT_EQ(cudaStreamSynchronize(compute), cudaSuccess);
  cudaStreamDestroy(compute);
  cudaFree(buffer);
  cudaFreeHost(flag);
}

}  // namespace
}  // namespace dstrain::comm
