// Parts of the NCCL communicator that need no GPU: dtype/op mapping, refusing CPU buffers, and a
// clear error on a machine without a device (or in a build without NCCL).

#include <gtest/gtest.h>

#include "comm/nccl_communicator.h"
#include "core/error.h"

#if DSTRAIN_TEST_HAVE_NCCL
#include <cuda_runtime_api.h>

#include "comm/nccl_dtype.h"
#endif

namespace dstrain::comm {
namespace {

template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "expected dstrain::Error";
  return Error(ErrorKind::kInternal, "none");
}

#if DSTRAIN_TEST_HAVE_NCCL
bool have_device() {
  int count = 0;
  bool ok = cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  cudaGetLastError();
  return ok;
}

TEST(NcclUnit, BuildHasTheNcclCommunicator) {
  EXPECT_TRUE(nccl_available());
}

TEST(NcclUnit, FloatingDtypesMapToTheirNcclTypes) {
  const auto kind = CollectiveKind::kAllReduce;
  EXPECT_EQ(nccl_dtype(kind, at::kFloat), ncclFloat32);
  EXPECT_EQ(nccl_dtype(kind, at::kDouble), ncclFloat64);
  EXPECT_EQ(nccl_dtype(kind, at::kBFloat16), ncclBfloat16);
  EXPECT_EQ(nccl_dtype(kind, at::kHalf), ncclFloat16);
}

TEST(NcclUnit, IntegerDtypeIsRefusedNamingCollectiveAndDtype) {
  Error e = error_of([] { nccl_dtype(CollectiveKind::kReduceScatter, at::kLong); });
  EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  EXPECT_NE(std::string(e.what()).find(to_string(CollectiveKind::kReduceScatter)),
            std::string::npos)
      << e.what();
  EXPECT_NE(std::string(e.what()).find("Long"), std::string::npos) << e.what();
}

TEST(NcclUnit, ReduceOpsMapToNcclOps) {
  EXPECT_EQ(nccl_op(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(nccl_op(ReduceOp::kAvg), ncclAvg);
  EXPECT_EQ(nccl_op(ReduceOp::kMax), ncclMax);
}

TEST(NcclUnit, CpuTensorIsRefusedWithAClearInternalError) {
  at::Tensor cpu = torch::zeros({8});
  Error e = error_of([&] { check_cuda_buffer(CollectiveKind::kAllReduce, "tensor", cpu, 0); });
  EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  EXPECT_NE(std::string(e.what()).find("CUDA tensor"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("cpu"), std::string::npos) << e.what();
}

TEST(NcclUnit, WithoutADeviceCreationFailsWithARuntimeErrorBeforeAnyRendezvous) {
  if (have_device()) GTEST_SKIP() << "this machine has a CUDA device; see the gpu-labelled tests";
  RendezvousOptions options;
  options.world_size = 2;  // would wait for a peer if it got as far as the rendezvous
  options.master_port = 1;
  Error e = error_of([&] { make_nccl_communicator(options); });
  EXPECT_EQ(e.kind(), ErrorKind::kRuntime);
  EXPECT_NE(std::string(e.what()).find("CUDA device"), std::string::npos) << e.what();
}
#else
TEST(NcclUnit, BuildWithoutNcclSaysSo) {
  EXPECT_FALSE(nccl_available());
  Error e = error_of([] { make_nccl_communicator(RendezvousOptions{}); });
  EXPECT_EQ(e.kind(), ErrorKind::kNotImplemented);
}
#endif

TEST(NcclUnit, InvalidRankIsAUsageErrorOrNotImplemented) {
  RendezvousOptions options;
  options.rank = 3;
  options.world_size = 2;
  Error e = error_of([&] { make_nccl_communicator(options); });
  EXPECT_EQ(e.kind(), nccl_available() ? ErrorKind::kUsage : ErrorKind::kNotImplemented);
}

}  // namespace
}  // namespace dstrain::comm
