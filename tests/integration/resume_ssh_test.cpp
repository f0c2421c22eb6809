// `dstrain resume` of a job launched over SSH (launcher/resume_plan.h): two SSH hosts in network
// namespaces (ssh_cluster.h) train the tiny model; a rank is SIGKILLed after a checkpoint, which
// ends the job; `dstrain resume <ckpt>/latest`, typed with no other flag, starts it again over
// SSH on both hosts from the recorded hostfile, with the recorded SSH key, known_hosts and --env,
// and logs the losses of the uninterrupted run. A host that no longer answers is then an error
// (exit 2) naming it, or with --min-nodes is left out and the job goes on on the other host with
// the checkpoint's global batch. No process is left.

#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/integration/ssh_cluster.h"
#include "tests/integration/ssh_fixture.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

namespace stdfs = std::filesystem;

class ResumeSshTest : public SshFixture {
 protected:
  ResumeSshTest() : SshFixture(2, 1) {}

  // `dstrain launch` over the two hosts, the run's outputs under `dir`.
  std::vector<std::string> launch(const std::string& config, const std::string& dir) const {
    std::vector<std::string> a = launch_args(
        {"--env", std::string("GLOO_SOCKET_IFNAME=") + SshCluster::kInterface, "--set",
         "logging.out_dir=" + dir + "/run", "--set", "checkpoint.dir=" + dir + "/ckpt"});
    a.push_back(config);
    return a;
  }

  std::vector<std::string> env() const {
    return {"DSTRAIN_TEST_MARKER=" + token_, "SSH_AUTH_SOCK="};
  }

  // Every sshd of host k: the listener and the sessions of earlier jobs.
  void lose_host(int k) {
    for (int pid : cluster_->processes_on(k)) {
      if (comm_of(pid) == "sshd") ::kill(pid, SIGKILL);
    }
    ::kill(cluster_->sshd_pid(k), SIGKILL);
  }

  void expect_no_process_left() {
    EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10))
        << processes_with_marker(token_).size() << " process(es) of the job survived";
  }
};

// 2 ranks (one per host) x micro 2, 12 steps, a checkpoint every 3.
JobSpec two_host_job() {
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 1;
  spec.micro = 2;
  spec.max_steps = 12;
  spec.checkpoint_interval = 3;
  return spec;
}

TEST_F(ResumeSshTest, ResumeFromLatestRunsOverBothRecordedHostsWithTheUninterruptedLosses) {
  const std::string config = write_job_config(tmp_.path(), two_host_job());
  RunResult full = run_dstrain(launch(config, tmp_.file("full")), env(), 240);
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  const auto reference = read_metric(tmp_.file("full/run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(reference.size(), 12u);

  // The same job, one of its ranks SIGKILLed after the first checkpoint: the job fails.
  Child job = start_dstrain(launch(config, tmp_.file("job")), env());
  ASSERT_TRUE(wait_until([&] { return file_exists(tmp_.file("job/ckpt/latest")); }, 180));
  pid_t victim = -1;
  ASSERT_TRUE(
      wait_until([&] { return (victim = rank_pid(processes_with_marker(token_), 1)) > 0; }, 20));
  ::kill(victim, SIGKILL);
  const RunResult failed = finish(job, 60);
  ASSERT_NE(failed.exit_code, 0) << failed.out << failed.err;
  expect_no_process_left();
  const auto record = nlohmann::json::parse(read_text(tmp_.file("job/ckpt/launch.json")));
  EXPECT_EQ(record["mode"], "ssh") << record.dump();
  EXPECT_EQ(record["ssh"]["hostfile"], hostfile_) << record.dump();
  const std::string tag = read_text(tmp_.file("job/ckpt/latest"));
  const long saved = std::stol(tag.substr(5));
  ASSERT_LT(saved, 12) << "the job finished before the kill";
  stdfs::rename(tmp_.file("job/run/metrics.jsonl"), tmp_.file("job/failed.jsonl"));

  // Typed with no flag: the record says how and where. Rank 1 runs in host 1's namespace.
  Child resume = start_dstrain({"resume", tmp_.file("job/ckpt/latest")}, env());
  std::string rank1_host;
  wait_until(
      [&] {
        const pid_t rank1 = rank_pid(processes_with_marker(token_), 1);
        if (rank1 > 0) rank1_host = netns_of(rank1);
        return !rank1_host.empty();
      },
      120);
  RunResult r = finish(resume, 240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("over SSH on the hosts of " + hostfile_ + " (as recorded)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[" + host(0) + ":0]"), std::string::npos) << r.out;
  EXPECT_EQ(rank1_host, cluster_->namespace_name(1));
  EXPECT_NE(r.err.find("all 2 node(s) exited 0"), std::string::npos) << r.err;
  const auto resumed = read_metric(tmp_.file("job/run/metrics.jsonl"), "train/loss");
  EXPECT_EQ(resumed.size(), static_cast<size_t>(12 - saved));
  expect_same_losses_after(saved, resumed, reference);
  expect_no_process_left();

  // Host 1 gone: an error naming it, before anything starts.
  lose_host(1);
  r = run_dstrain({"resume", tmp_.file("job/ckpt/latest")}, env(), 60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("1 of 2 host(s) of " + hostfile_ + " do not answer:\n  " + host(1) + ": "),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("[" + host(0)), std::string::npos) << r.out;

  // With --min-nodes 1 the job goes on on host 0 alone, accumulating 2 for the global batch of 4.
  r = run_dstrain({"resume", tmp_.file("job/ckpt/latest"), "--min-nodes", "1", "--set",
                   "training.max_steps=13"},
                  env(), 240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("host " + host(1) +
                       " does not answer: left out (1 of 2 host(s) remain, "
                       "--min-nodes 1)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("[" + host(0) + ":0]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[" + host(1)), std::string::npos) << r.out;
  const auto summary = nlohmann::json::parse(read_text(tmp_.file("job/run/summary.json")));
  EXPECT_EQ(summary["world_size"].get<int>(), 1) << summary.dump();
  EXPECT_EQ(summary["steps"].get<int>(), 13) << summary.dump();
  // Step 13 read as many tokens as each of the 2-rank steps: the global batch was kept.
  const auto full_summary = nlohmann::json::parse(read_text(tmp_.file("full/run/summary.json")));
  EXPECT_EQ(summary["tokens"].get<long>(), full_summary["tokens"].get<long>() / 12 * 13)
      << summary.dump() << full_summary.dump();
  const auto record_after = nlohmann::json::parse(read_text(tmp_.file("job/ckpt/launch.json")));
  EXPECT_EQ(record_after["hosts"], nlohmann::json::array({host(0)})) << record_after.dump();
  expect_no_process_left();
}

}  // namespace
}  // namespace dstrain::testing
