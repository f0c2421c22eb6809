// Multi-node restarts (`--max-restarts` with `--hostfile`, `--min-nodes`): three SSH hosts in
// network namespaces (ssh_cluster.h) train the tiny model; one host is lost (every sshd on it
// killed) after the first checkpoint; the launcher finds it unreachable, leaves it out and restarts
// on the other two from `latest` with the same global batch. No process is left.

#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/integration/ssh_cluster.h"
#include "tests/integration/ssh_fixture.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

class LaunchElasticTest : public SshFixture {
 protected:
  LaunchElasticTest() : SshFixture(3, 1) {}

  std::vector<std::string> launch(const std::string& config, const std::string& dir,
                                  const std::vector<std::string>& extra) {
    std::vector<std::string> a = launch_args(
        {"--env", std::string("GLOO_SOCKET_IFNAME=") + SshCluster::kInterface, "--set",
         "logging.out_dir=" + dir + "/run", "--set", "checkpoint.dir=" + dir + "/ckpt"});
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(config);
    return a;
  }

  std::vector<std::string> env() const {
    return {"DSTRAIN_TEST_MARKER=" + token_, "SSH_AUTH_SOCK="};
  }

  // Every sshd of host k: the listener and the sessions (monitor and child) of this job.
  void lose_host(int k) {
    for (int pid : cluster_->processes_on(k)) {
      if (comm_of(pid) == "sshd") ::kill(pid, SIGKILL);
    }
    ::kill(cluster_->sshd_pid(k), SIGKILL);
  }
};

// 3 ranks (one per host) x micro 2 x accumulation 2: a global batch of 12, kept on 2 ranks by
// accumulating 3.
JobSpec three_host_job() {
  JobSpec spec;
  spec.nproc = 3;
  spec.stage = 1;
  spec.micro = 2;
  spec.accum = 2;
  spec.max_steps = 16;
  spec.checkpoint_interval = 4;
  spec.extra_overrides = {"training.log_interval=1"};
  return spec;
}

TEST_F(LaunchElasticTest, ALostHostIsLeftOutAndTheJobGoesOnWithTheSameGlobalBatch) {
  const JobSpec spec = three_host_job();
  const std::string config = write_job_config(tmp_.path(), spec);
  std::vector<std::string> sets;
  for (const std::string& kv : spec.extra_overrides) sets.insert(sets.end(), {"--set", kv});

  RunResult full = run_dstrain(launch(config, tmp_.file("full"), sets), env(), 240);
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  const auto reference = read_metric(tmp_.file("full/run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(reference.size(), 16u);

  std::vector<std::string> elastic = sets;
  elastic.insert(elastic.end(), {"--max-restarts", "1", "--min-nodes", "2", "--restart-backoff",
                                 "0.5", "--ssh-keepalive", "3"});
  Child job = start_dstrain(launch(config, tmp_.file("elastic"), elastic), env());
  ASSERT_TRUE(wait_until([&] { return file_exists(tmp_.file("elastic/ckpt/latest")); }, 180));
  lose_host(2);
  const RunResult r = finish(job, 300);
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("host " + host(2) + " cannot be reached again"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dstrain launch: restart 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("all 2 node(s) exited 0"), std::string::npos) << r.err;

  // Every step once; the steps after the checkpoint trained on 2 ranks with the same samples per
  // step follow the 3-rank run to within reduction-order rounding.
  const auto got = read_metric(tmp_.file("elastic/run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(got.size(), reference.size());
  for (const auto& [step, loss] : reference)
    EXPECT_NEAR(got.at(step), loss, 1e-3 * std::abs(loss)) << "step " << step;
  const auto summary = nlohmann::json::parse(read_text(tmp_.file("elastic/run/summary.json")));
  EXPECT_EQ(summary["world_size"].get<int>(), 2);
  EXPECT_EQ(summary["restarts"].get<int>(), 1);
  EXPECT_EQ(summary["restart_causes"][0]["host"].get<std::string>(), host(2));
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10))
      << processes_with_marker(token_).size() << " process(es) of the job survived";
}

}  // namespace
}  // namespace dstrain::testing
