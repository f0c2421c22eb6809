// Device selection on a machine (or build) without CUDA, and its DSTRAIN_DEVICE override; the
// LOCAL_WORLD_SIZE the launcher gives every rank; DSTRAIN_CUDA_MEMORY_FRACTION's parsing (its
// effect on the CUDA allocator needs a GPU: scripts/bench/long-seq --device cuda).
#include <stdlib.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "core/error.h"
#include "train/device.h"

namespace dstrain::train {
namespace {

class DeviceEnv : public ::testing::Test {
 protected:
  void TearDown() override {
    ::unsetenv("DSTRAIN_DEVICE");
    ::unsetenv("LOCAL_WORLD_SIZE");
    ::unsetenv("DSTRAIN_CUDA_MEMORY_FRACTION");
  }
};

TEST_F(DeviceEnv, WithoutAVisibleGpuTheRankComputesOnTheCpu) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible";
  ::unsetenv("DSTRAIN_DEVICE");
  EXPECT_TRUE(select_device(0).is_cpu());
  EXPECT_TRUE(select_device(5).is_cpu());
  EXPECT_TRUE(device_memory_metrics(torch::Device(torch::kCPU)).empty());
}

TEST_F(DeviceEnv, AskingForCudaWithoutADeviceIsAUsageError) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible";
  ::setenv("DSTRAIN_DEVICE", "cuda", 1);
  try {
    select_device(0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
}

TEST(NvidiaGpus, CountsTheDriversListAndNothingWithoutTheDriver) {
  const std::string dir = ::testing::TempDir() + "/dstrain_gpus_listed";
  std::filesystem::remove_all(dir);
  EXPECT_EQ(nvidia_gpus_listed(dir), 0);  // no driver
  std::filesystem::create_directories(dir + "/0000:17:00.0");
  std::filesystem::create_directories(dir + "/0000:65:00.0");
  EXPECT_EQ(nvidia_gpus_listed(dir), 2);
  std::filesystem::remove_all(dir);
}

TEST_F(DeviceEnv, CpuIsAlwaysHonouredAndOtherValuesAreRefused) {
  ::setenv("DSTRAIN_DEVICE", "cpu", 1);
  EXPECT_TRUE(select_device(0).is_cpu());
  ::setenv("DSTRAIN_DEVICE", "gpu", 1);
  try {
    select_device(0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("expected cpu or cuda"), std::string::npos) << e.what();
  }
}

TEST_F(DeviceEnv, LocalWorldSizeIsOneWhenUnsetAndAPositiveIntegerOtherwise) {
  ::unsetenv("LOCAL_WORLD_SIZE");
  EXPECT_EQ(local_world_size(), 1);
  ::setenv("LOCAL_WORLD_SIZE", "8", 1);
  EXPECT_EQ(local_world_size(), 8);
  for (const char* bad : {"0", "-2", "four", "4x", "99999999999"}) {
    ::setenv("LOCAL_WORLD_SIZE", bad, 1);
    try {
      local_world_size();
      FAIL() << "expected an error for " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << bad;
      const std::string what = e.what();
      EXPECT_NE(what.find("LOCAL_WORLD_SIZE='" + std::string(bad) + "'"), std::string::npos)
          << what;
    }
  }
}

TEST_F(DeviceEnv, MemoryFractionIsUnsetOrANumberAboveZeroAndAtMostOne) {
  ::unsetenv("DSTRAIN_CUDA_MEMORY_FRACTION");
  EXPECT_EQ(cuda_memory_fraction(), 0);
  ::setenv("DSTRAIN_CUDA_MEMORY_FRACTION", "", 1);
  EXPECT_EQ(cuda_memory_fraction(), 0);
  ::setenv("DSTRAIN_CUDA_MEMORY_FRACTION", "0.2", 1);
  EXPECT_DOUBLE_EQ(cuda_memory_fraction(), 0.2);
  ::setenv("DSTRAIN_CUDA_MEMORY_FRACTION", "1", 1);
  EXPECT_DOUBLE_EQ(cuda_memory_fraction(), 1.0);
  // On the CPU the fraction is accepted and only warned about.
  EXPECT_NO_THROW(limit_device_memory(torch::Device(torch::kCPU)));
  for (const char* bad : {"0", "-0.5", "1.5", "half", "0.5x", "nan", "1e999"}) {
    ::setenv("DSTRAIN_CUDA_MEMORY_FRACTION", bad, 1);
    try {
      limit_device_memory(torch::Device(torch::kCPU));
      FAIL() << "expected an error for " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << bad;
      const std::string what = e.what();
      EXPECT_NE(what.find("DSTRAIN_CUDA_MEMORY_FRACTION='" + std::string(bad) + "'"),
                std::string::npos)
          << what;
      EXPECT_NE(what.find("greater than 0 and at most 1"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace dstrain::train
