#include "launcher/launch_local.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

LocalLaunchOptions exec_options(int nproc) {
  LocalLaunchOptions o;
  o.nproc = nproc;
  o.exec = true;
  o.args = {"sh", "-c", "echo $RANK"};
  return o;
}

TEST(LaunchLocal, ExecPlanRunsTheResolvedProgram) {
  LocalLaunchOptions o = exec_options(2);
  o.master_port = 29501;
  WorldPlan plan = plan_local_launch(o);
  ASSERT_EQ(plan.ranks.size(), 2u);
  EXPECT_EQ(plan.master_port, 29501);
  EXPECT_EQ(plan.master_addr, "127.0.0.1");
  EXPECT_EQ(plan.ranks[1].argv.size(), 3u);
  EXPECT_EQ(plan.ranks[1].argv[0][0], '/');
  EXPECT_EQ(plan.ranks[1].argv[2], "echo $RANK");
}

TEST(LaunchLocal, PicksAFreePortWhenNoneIsGiven) {
  WorldPlan plan = plan_local_launch(exec_options(1));
  EXPECT_GE(plan.master_port, 1);
  EXPECT_LE(plan.master_port, 65535);
}

TEST(LaunchLocal, FormatPlanShowsEnvAndQuotedCommand) {
  LocalLaunchOptions o = exec_options(2);
  o.master_port = 29501;
  std::string text = format_plan(plan_local_launch(o));
  EXPECT_NE(text.find("2 rank(s), master 127.0.0.1:29501"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 on localhost (node 0, local rank 1)"), std::string::npos) << text;
  EXPECT_NE(text.find("RANK=1 LOCAL_RANK=1 WORLD_SIZE=2"), std::string::npos) << text;
  EXPECT_NE(text.find(" -c 'echo $RANK'\n"), std::string::npos) << text;
}

void expect_error(const LocalLaunchOptions& o, ErrorKind kind, const std::string& needle) {
  try {
    plan_local_launch(o);
    FAIL() << "expected an error containing " << needle;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LaunchLocal, RejectsBadOptions) {
  LocalLaunchOptions o = exec_options(0);
  expect_error(o, ErrorKind::kUsage, "--nproc");
  o = exec_options(1);
  o.master_port = 65536;
  expect_error(o, ErrorKind::kUsage, "--master-port");
  o = exec_options(1);
  o.grace_seconds = -1;
  expect_error(o, ErrorKind::kUsage, "--grace");
  o = exec_options(1);
  o.args.clear();
  expect_error(o, ErrorKind::kUsage, "--exec needs a program");
  o = exec_options(1);
  o.overrides = {"a=1"};
  expect_error(o, ErrorKind::kUsage, "--set");
  o = exec_options(1);
  o.args = {"no-such-program-dstrain-test"};
  expect_error(o, ErrorKind::kUsage, "not found on PATH");
}

TEST(LaunchLocal, TrainModeNeedsAnExistingConfig) {
  LocalLaunchOptions o;
  expect_error(o, ErrorKind::kUsage, "missing CONFIG");
  o.config_path = "/nonexistent/run.yaml";
  expect_error(o, ErrorKind::kInput, "/nonexistent/run.yaml");
}

std::string env_of(const RankSpec& rank, const std::string& name) {
  for (const auto& [key, value] : rank.env) {
    if (key == name) return value;
  }
  return "<unset>";
}

// Sets (or unsets, for nullptr) a variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ~ScopedEnv() {
    old_.empty() ? ::unsetenv(name_.c_str()) : ::setenv(name_.c_str(), old_.c_str(), 1);
  }

 private:
  std::string name_, old_;
};

TEST(LaunchLocal, SharedGpuGivesEveryRankItsOwnNcclHostOnTheLoopback) {
  ScopedEnv ifname("NCCL_SOCKET_IFNAME", nullptr);
  ScopedEnv share("DSTRAIN_SHARE_GPU", nullptr);
  LocalLaunchOptions o = exec_options(3);
  o.share_gpu = true;
  const WorldPlan plan = plan_local_launch(o);
  std::set<std::string> host_ids;
  for (const RankSpec& rank : plan.ranks) {
    EXPECT_EQ(env_of(rank, "DSTRAIN_SHARE_GPU"), "1");
    EXPECT_EQ(env_of(rank, "NCCL_SOCKET_IFNAME"), "lo");
    EXPECT_EQ(env_of(rank, "LOCAL_RANK"), std::to_string(rank.rank));
    host_ids.insert(env_of(rank, "NCCL_HOSTID"));
  }
  EXPECT_EQ(host_ids.size(), 3u);
  EXPECT_EQ(host_ids.count("<unset>"), 0u);
  const std::string text = format_plan(plan);
  EXPECT_NE(text.find("DSTRAIN_SHARE_GPU=1 NCCL_HOSTID=dstrain-shared-gpu-rank-2"),
            std::string::npos)
      << text;
}

TEST(LaunchLocal, SharedGpuKeepsTheUsersSocketInterfaceAndComesFromTheEnvironment) {
  ScopedEnv ifname("NCCL_SOCKET_IFNAME", "eth7");
  ScopedEnv share("DSTRAIN_SHARE_GPU", "1");
  const WorldPlan plan = plan_local_launch(exec_options(2));
  EXPECT_EQ(env_of(plan.ranks[1], "DSTRAIN_SHARE_GPU"), "1");
  EXPECT_EQ(env_of(plan.ranks[1], "NCCL_SOCKET_IFNAME"), "<unset>");  // inherited as it is
}

TEST(LaunchLocal, WithoutSharingNoRankGetsTheSharedGpuVariables) {
  ScopedEnv share("DSTRAIN_SHARE_GPU", "0");
  const WorldPlan plan = plan_local_launch(exec_options(2));
  EXPECT_EQ(env_of(plan.ranks[0], "DSTRAIN_SHARE_GPU"), "<unset>");
  EXPECT_EQ(env_of(plan.ranks[0], "NCCL_HOSTID"), "<unset>");
}

TEST(LaunchLocal, ABadSharedGpuVariableIsAUsageError) {
  ScopedEnv share("DSTRAIN_SHARE_GPU", "yes");
  expect_error(exec_options(2), ErrorKind::kUsage, "DSTRAIN_SHARE_GPU='yes': expected 0 or 1");
}

}  // namespace
}  // namespace dstrain::launcher
