#include "launcher/slurm.h"

#include <map>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

EnvMap srun_rank_env() {
  return {{"SLURM_JOB_ID", "123456"},
          {"SLURM_JOB_NODELIST", "gpu[07-08]"},
          {"SLURM_PROCID", "5"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NTASKS", "8"},
          {"SLURM_NODEID", "1"},
          {"SLURM_TASKS_PER_NODE", "4(x2)"}};
}

TEST(Slurm, RankVariablesFromSrun) {
  auto env = torch_env_from_slurm(srun_rank_env());
  std::map<std::string, std::string> m(env.begin(), env.end());
  EXPECT_EQ(m["RANK"], "5");
  EXPECT_EQ(m["LOCAL_RANK"], "1");
  EXPECT_EQ(m["WORLD_SIZE"], "8");
  EXPECT_EQ(m["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(m["NODE_RANK"], "1");
  EXPECT_EQ(m["GROUP_RANK"], "1");
  EXPECT_EQ(m["MASTER_ADDR"], "gpu07");
  EXPECT_EQ(m["MASTER_PORT"], std::to_string(slurm_master_port(123456)));
}

TEST(Slurm, UnevenTasksPerNodeAndExplicitMaster) {
  EnvMap env = srun_rank_env();
  env["SLURM_TASKS_PER_NODE"] = "2,3(x2)";
  env["SLURM_NODEID"] = "2";
  env["MASTER_ADDR"] = "10.1.1.1";
  env["MASTER_PORT"] = "40000";
  auto out = torch_env_from_slurm(env);
  std::map<std::string, std::string> m(out.begin(), out.end());
  EXPECT_EQ(m["LOCAL_WORLD_SIZE"], "3");
  EXPECT_EQ(m["MASTER_ADDR"], "10.1.1.1");
  EXPECT_EQ(m["MASTER_PORT"], "40000");
}

TEST(Slurm, NothingWhenRankIsSetOrNotUnderSrun) {
  EnvMap env = srun_rank_env();
  env["RANK"] = "0";
  EXPECT_TRUE(torch_env_from_slurm(env).empty());
  EXPECT_TRUE(torch_env_from_slurm({{"SLURM_JOB_ID", "1"}}).empty());
}

TEST(Slurm, MalformedVariablesAreNamed) {
  EnvMap env = srun_rank_env();
  env["SLURM_NTASKS"] = "eight";
  try {
    torch_env_from_slurm(env);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("SLURM_NTASKS='eight'"), std::string::npos);
  }
  env = srun_rank_env();
  env["SLURM_TASKS_PER_NODE"] = "4(x";
  EXPECT_THROW(torch_env_from_slurm(env), Error);
}

TEST(Slurm, MasterPortIsStableAndBelowEphemeralRange) {
  EXPECT_EQ(slurm_master_port(42), slurm_master_port(42));
  EXPECT_NE(slurm_master_port(42), slurm_master_port(43));
  for (long id : {0L, 1L, 14999L, 15000L, 987654321L}) {
    EXPECT_GE(slurm_master_port(id), 15000);
    EXPECT_LT(slurm_master_port(id), 30000);
  }
}

TEST(Slurm, SrunStartsOneAgentPerNode) {
  SlurmLaunchOptions o;
  o.launch.nproc = 2;
  o.launch.exec = true;
  o.launch.args = {"/bin/sh", "-c", "env"};
  EnvMap env = {
      {"SLURM_JOB_ID", "77"}, {"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_JOB_NUM_NODES", "3"}};
  std::vector<std::string> argv = srun_command(o, env, "/opt/dstrain");
  std::vector<std::string> expected = {"srun",
                                       "--kill-on-bad-exit=1",
                                       "--ntasks-per-node=1",
                                       "--nodes=3",
                                       "--ntasks=3",
                                       "/opt/dstrain",
                                       "launch",
                                       "--slurm-agent",
                                       "--nproc",
                                       "2",
                                       "--master-addr",
                                       "n1",
                                       "--master-port",
                                       std::to_string(slurm_master_port(77)),
                                       "--grace",
                                       "5",
                                       "--exec",
                                       "--",
                                       "/bin/sh",
                                       "-c",
                                       "env"};
  EXPECT_EQ(argv, expected);
}

// After a failure (--max-restarts): the remaining nodes by name, the master on the first of them
// (the first node of the allocation may be the one lost), --overlap and the step's name.
TEST(Slurm, RestartStepRunsOnTheRemainingNodes) {
  SlurmLaunchOptions o;
  o.launch.nproc = 2;
  o.launch.exec = true;
  o.launch.args = {"/bin/true"};
  o.nodes = {"n2", "n3"};
  o.overlap = true;
  o.step_name = "dstrain-agents-1";
  EnvMap env = {
      {"SLURM_JOB_ID", "77"}, {"SLURM_JOB_NODELIST", "n[1-3]"}, {"SLURM_JOB_NUM_NODES", "3"}};
  std::vector<std::string> argv = srun_command(o, env, "/opt/dstrain");
  std::vector<std::string> head(argv.begin(), argv.begin() + 14);
  std::vector<std::string> expected = {"srun",
                                       "--kill-on-bad-exit=1",
                                       "--ntasks-per-node=1",
                                       "--nodes=2",
                                       "--ntasks=2",
                                       "--nodelist=n2,n3",
                                       "--overlap",
                                       "--job-name=dstrain-agents-1",
                                       "/opt/dstrain",
                                       "launch",
                                       "--slurm-agent",
                                       "--nproc",
                                       "2",
                                       "--master-addr"};
  EXPECT_EQ(head, expected);
  EXPECT_EQ(argv[14], "n2");
}

TEST(Slurm, AgentPlacement) {
  auto p = slurm_agent_placement(
      {{"SLURM_NODEID", "1"}, {"SLURM_STEP_NUM_NODES", "2"}, {"SLURMD_NODENAME", "n2"}});
  EXPECT_EQ(p.node_rank, 1);
  EXPECT_EQ(p.num_nodes, 2);
  EXPECT_EQ(p.host, "n2");
  EXPECT_THROW(slurm_agent_placement({{"SLURM_NODEID", "2"}, {"SLURM_NNODES", "2"}}), Error);
}

}  // namespace
}  // namespace dstrain::launcher
