#include "launcher/multi_node.h"

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/secrets.h"
#include "launcher/node_agent.h"

namespace dstrain::launcher {
namespace {

namespace fs = std::filesystem;

std::map<std::string, std::string> as_map(const EnvList& env) {
  return {env.begin(), env.end()};
}

class MultiNodePlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = fs::temp_directory_path().string() + "/dstrain_plan_XXXXXX";
    dir_ = ::mkdtemp(pattern.data());
    options_.hostfile = dir_ + "/hosts";
    options_.launch.exec = true;
    options_.launch.args = {"/bin/echo", "hi"};
    options_.launch.master_port = 29511;
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write_hosts(const std::string& text) { std::ofstream(options_.hostfile) << text; }
  MultiNodePlan plan() {
    const char* environ[] = {"NCCL_DEBUG=INFO", nullptr};
    return plan_multi_node(options_, environ);
  }

  std::string dir_;
  MultiNodeOptions options_;
};

TEST_F(MultiNodePlanTest, RanksAreContiguousPerNodeWithUnevenSlots) {
  write_hosts("alpha slots=2\nbeta slots=3\ngamma slots=1\n");
  MultiNodePlan p = plan();
  ASSERT_EQ(p.world.world_size, 6);
  const char* hosts[] = {"alpha", "alpha", "beta", "beta", "beta", "gamma"};
  const char* local[] = {"0", "1", "0", "1", "2", "0"};
  const char* local_ws[] = {"2", "2", "3", "3", "3", "1"};
  const char* node[] = {"0", "0", "1", "1", "1", "2"};
  const char* devices[] = {"0,1", "0,1", "0,1,2", "0,1,2", "0,1,2", "0"};
  for (int r = 0; r < 6; ++r) {
    auto env = as_map(p.world.ranks[r].env);
    EXPECT_EQ(p.world.ranks[r].host, hosts[r]);
    EXPECT_EQ(env["RANK"], std::to_string(r));
    EXPECT_EQ(env["LOCAL_RANK"], local[r]);
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], local_ws[r]);
    EXPECT_EQ(env["WORLD_SIZE"], "6");
    EXPECT_EQ(env["NODE_RANK"], node[r]);
    EXPECT_EQ(env["GROUP_RANK"], node[r]);
    EXPECT_EQ(env["CUDA_VISIBLE_DEVICES"], devices[r]);
    EXPECT_EQ(env["MASTER_ADDR"], "alpha");
    EXPECT_EQ(env["MASTER_PORT"], "29511");
  }
  EXPECT_EQ(p.agent_commands.size(), 3u);
}

TEST_F(MultiNodePlanTest, IncludedSlotsBecomeCudaVisibleDevices) {
  write_hosts("alpha slots=4\nbeta slots=4\n");
  options_.selection.include = "beta:1,3@alpha:2";
  options_.master_addr_given = true;
  options_.launch.master_addr = "10.0.0.9";
  MultiNodePlan p = plan();
  ASSERT_EQ(p.world.world_size, 3);
  EXPECT_EQ(as_map(p.world.ranks[0].env)["CUDA_VISIBLE_DEVICES"], "2");
  EXPECT_EQ(p.world.ranks[0].host, "alpha");
  EXPECT_EQ(as_map(p.world.ranks[2].env)["CUDA_VISIBLE_DEVICES"], "1,3");
  EXPECT_EQ(as_map(p.world.ranks[2].env)["LOCAL_RANK"], "1");
  EXPECT_EQ(as_map(p.world.ranks[2].env)["MASTER_ADDR"], "10.0.0.9");
}

// The agent rebuilds the world from its command line; its ranks must equal the root's.
TEST_F(MultiNodePlanTest, EveryAgentRebuildsTheRootPlanForItsNode) {
  write_hosts("alpha slots=2\nbeta slots=3\n");
  options_.selection.exclude = "beta:0";
  MultiNodePlan p = plan();
  for (int k = 0; k < 2; ++k) {
    AgentOptions agent;
    agent.launch = options_.launch;
    agent.launch.master_addr = p.world.master_addr;
    agent.node_rank = k;
    agent.nodes_nproc = {2, 2};
    agent.devices = p.nodes[k].slots;
    agent.host = p.nodes[k].entry.host;
    WorldPlan mine = plan_node_agent(agent);
    std::vector<RankSpec> a = ranks_on_node(mine, k);
    std::vector<RankSpec> b = ranks_on_node(p.world, k);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].env, b[i].env);
      EXPECT_EQ(a[i].argv, b[i].argv);
      EXPECT_EQ(a[i].host, b[i].host);
    }
  }
  std::vector<std::string> argv = agent_argv(options_, p, 1, "/opt/dstrain");
  auto has = [&](const std::vector<std::string>& seq) {
    return std::search(argv.begin(), argv.end(), seq.begin(), seq.end()) != argv.end();
  };
  EXPECT_TRUE(has({"--node-rank", "1"}));
  EXPECT_TRUE(has({"--nodes-nproc", "2,2"}));
  EXPECT_TRUE(has({"--node-devices", "1,2"}));
  EXPECT_TRUE(has({"--exec", "--", "/bin/echo", "hi"}));
}

TEST_F(MultiNodePlanTest, DryRunListsEveryHostAndForwardedVariables) {
  write_hosts("root@alpha:2222 slots=1\nbeta slots=1 ssh_port=2200\n");
  std::string text = format_multi_node_plan(plan());
  EXPECT_NE(text.find("2 rank(s) on 2 host(s), master alpha:29511"), std::string::npos) << text;
  EXPECT_NE(text.find("host alpha (node 0, ssh root@alpha:2222"), std::string::npos) << text;
  EXPECT_NE(text.find("host beta (node 1, ssh beta:2200"), std::string::npos) << text;
  EXPECT_NE(text.find("export NCCL_DEBUG=INFO"), std::string::npos) << text;
}

TEST_F(MultiNodePlanTest, HostfileErrorsSurface) {
  write_hosts("alpha slots=2\nalpha slots=1\n");
  try {
    plan();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find(options_.hostfile + ":2"), std::string::npos);
  }
}

TEST_F(MultiNodePlanTest, SecretVariablesGoOnTheChannelAndTheDryRunRedactsThem) {
  write_hosts("alpha slots=1\nbeta slots=1\n");
  const std::string token = "hf_plan_test_value_77";
  const std::string named = "named-secret-value-88";
  options_.env = {"WANDB_API_KEY=flag-secret-value-99", "DSTRAIN_PLAIN=visible"};
  options_.secret_env = {"PROBE_NAMED_SECRET"};
  secrets::add_secret_names(options_.secret_env);
  const std::string hf = "HF_TOKEN=" + token, probe = "PROBE_NAMED_SECRET=" + named;
  const char* environ[] = {"NCCL_DEBUG=INFO", hf.c_str(), probe.c_str(), nullptr};
  MultiNodePlan p = plan_multi_node(options_, environ);
  EXPECT_EQ(as_map(p.secret_env),
            (std::map<std::string, std::string>{{"HF_TOKEN", token},
                                                {"PROBE_NAMED_SECRET", named},
                                                {"WANDB_API_KEY", "flag-secret-value-99"}}));
  for (const std::string& command : p.agent_commands) {
    for (const std::string& value : {token, named, std::string("flag-secret-value-99")})
      EXPECT_EQ(command.find(value), std::string::npos) << command;
    EXPECT_NE(command.find("export DSTRAIN_PLAIN=visible"), std::string::npos) << command;
    EXPECT_NE(command.find(" --env-on-stdin "), std::string::npos) << command;
  }
  const std::string text = format_multi_node_plan(p);
  for (const std::string& value : {token, named, std::string("flag-secret-value-99")})
    EXPECT_EQ(text.find(value), std::string::npos) << text;
  EXPECT_NE(text.find("on the connection (stdin), never on a command line: HF_TOKEN=<redacted> "
                      "PROBE_NAMED_SECRET=<redacted> WANDB_API_KEY=<redacted>"),
            std::string::npos)
      << text;
}

// The root launcher's stop line names the failed rank; the agent reads it back and tells its ranks.
TEST(AgentStopLine, NamesTheFailedRankAndReadsBack) {
  const teardown::RankFailure failure{-1, "node1", "node 1 (ranks 2-3): exit code 137"};
  const std::string line = agent_stop_line_for(failure);
  EXPECT_EQ(line.rfind(kAgentStopForFailedRankLine, 0), 0u) << line;
  const std::optional<teardown::RankFailure> back = failure_of_agent_stop_line(line);
  ASSERT_TRUE(back.has_value()) << line;
  EXPECT_EQ(back->rank, -1);
  EXPECT_EQ(back->host, "node1");
  EXPECT_EQ(back->cause, failure.cause);
  // A bare stop line (nothing named) still says a rank failed; other lines say nothing.
  ASSERT_TRUE(failure_of_agent_stop_line(kAgentStopForFailedRankLine).has_value());
  EXPECT_EQ(failure_of_agent_stop_line(kAgentStopForFailedRankLine)->rank, -1);
  for (const char* other : {kAgentStopLine, kAgentPingLine, "dstrain-agent-stop-rank-failedX"})
    EXPECT_FALSE(failure_of_agent_stop_line(other).has_value()) << other;
}

}  // namespace
}  // namespace dstrain::launcher
