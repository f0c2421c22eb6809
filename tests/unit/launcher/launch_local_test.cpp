#include "launcher/launch_local.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace dstrain::launcher
