#include <cstdlib>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "comm/gloo_communicator.h"
#include "core/error.h"

namespace dstrain::comm {
namespace {

using ::testing::HasSubstr;

class EnvOptions : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name :
         {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "DSTRAIN_COMM_TIMEOUT"}) {
      unsetenv(name);
    }
  }
  void TearDown() override { SetUp(); }

  static void expect_usage_error(const char* fragment) {
    try {
      rendezvous_options_from_env();
      ADD_FAILURE() << "expected a usage error mentioning " << fragment;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_THAT(e.what(), HasSubstr(fragment));
    }
  }
};

TEST_F(EnvOptions, AbsentVariablesMeanASingleProcessWorld) {
  RendezvousOptions options = rendezvous_options_from_env();
  EXPECT_EQ(options.rank, 0);
  EXPECT_EQ(options.world_size, 1);
  EXPECT_EQ(options.master_addr, "127.0.0.1");
  EXPECT_EQ(options.master_port, 29500);
}

TEST_F(EnvOptions, ReadsEveryVariable) {
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("MASTER_ADDR", "node01", 1);
  setenv("MASTER_PORT", "12345", 1);
  setenv("DSTRAIN_COMM_TIMEOUT", "2.5", 1);
  RendezvousOptions options = rendezvous_options_from_env();
  EXPECT_EQ(options.rank, 3);
  EXPECT_EQ(options.world_size, 8);
  EXPECT_EQ(options.master_addr, "node01");
  EXPECT_EQ(options.master_port, 12345);
  EXPECT_EQ(options.timeout.count(), 2500);
}

TEST_F(EnvOptions, MalformedValuesAreUsageErrorsNamingTheVariable) {
  setenv("WORLD_SIZE", "4", 1);
  setenv("RANK", "two", 1);
  expect_usage_error("RANK='two'");
  setenv("RANK", "4", 1);
  expect_usage_error("RANK=4 must be below WORLD_SIZE=4");
  setenv("RANK", "1", 1);
  setenv("MASTER_PORT", "70000", 1);
  expect_usage_error("MASTER_PORT='70000'");
  setenv("MASTER_PORT", "29501", 1);
  setenv("DSTRAIN_COMM_TIMEOUT", "-3", 1);
  expect_usage_error("DSTRAIN_COMM_TIMEOUT='-3'");
}

TEST_F(EnvOptions, RankWithoutWorldSizeIsAUsageError) {
  setenv("RANK", "0", 1);
  expect_usage_error("RANK is set but WORLD_SIZE is not");
}

TEST(GlooSingleRank, CollectivesAreLocalAndCountNoBytes) {
  auto comm = make_gloo_communicator(RendezvousOptions{});
  torch::Tensor input = torch::arange(10, torch::kFloat);
  torch::Tensor output = torch::zeros({10});
  comm->reduce_scatter(output, input, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(output.equal(input));
  comm->barrier();
  EXPECT_EQ(comm->stats().total_bytes(), 0u);
  EXPECT_EQ(comm->stats().calls.at(CollectiveKind::kReduceScatter), 1u);
}

}  // namespace
}  // namespace dstrain::comm
