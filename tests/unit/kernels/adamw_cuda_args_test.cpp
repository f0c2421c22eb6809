// Host-side checks of the CUDA AdamW entry point that need no device: they run on every machine.

#include <gtest/gtest.h>

#include "core/error.h"
#include "kernels/adamw_cuda.h"

namespace dstrain::kernels {
namespace {

ErrorKind kind_of_call(const AdamWBuffers& buffers) {
  try {
    adamw_update_cuda(buffers, AdamWStep{}, nullptr);
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::kRuntime;  // "no error" would be wrong for every case below
}

TEST(AdamWCudaArgs, BuildReportsWhetherCudaKernelsAreCompiled) {
#if DSTRAIN_TEST_HAVE_CUDA
  EXPECT_TRUE(cuda_kernels_available());
#else
  EXPECT_FALSE(cuda_kernels_available());
#endif
}

#if DSTRAIN_TEST_HAVE_CUDA
TEST(AdamWCudaArgs, ZeroElementsIsANoOpEvenWithoutDevicePointers) {
  EXPECT_NO_THROW(adamw_update_cuda(AdamWBuffers{}, AdamWStep{}, nullptr));
}

TEST(AdamWCudaArgs, NegativeCountIsAnInternalError) {
  AdamWBuffers b;
  b.n = -1;
  EXPECT_EQ(kind_of_call(b), ErrorKind::kInternal);
}

TEST(AdamWCudaArgs, MissingPointerIsAnInternalErrorNamingTheBuffers) {
  float x = 0;
  AdamWBuffers b{&x, &x, nullptr, &x, GradType::kFloat32, nullptr, 4};
  EXPECT_EQ(kind_of_call(b), ErrorKind::kInternal);
  try {
    adamw_update_cuda(b, AdamWStep{}, nullptr);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg_sq"), std::string::npos) << e.what();
  }
}
#else
TEST(AdamWCudaArgs, WithoutCudaTheKernelIsNotImplemented) {
  AdamWBuffers b;
  b.n = 1;
  EXPECT_EQ(kind_of_call(b), ErrorKind::kNotImplemented);
}
#endif

}  // namespace
}  // namespace dstrain::kernels
