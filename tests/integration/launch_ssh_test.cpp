// `dstrain launch --hostfile` over real SSH: a cluster of network namespaces, each with its own
// sshd (ssh_cluster.h). Ranks are `sh -c` scripts (--exec) that print their environment, sleep or
// fail; every process of a job carries DSTRAIN_TEST_MARKER (forwarded as a DSTRAIN_ variable), so
// the tests can check that nothing survives a teardown on any host.

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/integration/ssh_cluster.h"
#include "tests/integration/ssh_fixture.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

class LaunchSshTest : public SshFixture {
 protected:
  LaunchSshTest() : SshFixture(2) {}

  // launch flags + --exec -- sh -c SCRIPT
  std::vector<std::string> args(const std::string& script, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = launch_args(extra);
    a.insert(a.end(), {"--exec", "--", "/bin/sh", "-c", script});
    return a;
  }

  std::vector<std::string> env() const {
    return {"DSTRAIN_TEST_MARKER=" + token_, "SSH_AUTH_SOCK=", "NCCL_TEST_VALUE=a b'c$d"};
  }

  // sigterm_probe as every rank, each announcing in tmp_ once it has blocked SIGTERM (a rank that
  // exists but is still loading would die of a SIGTERM without saying why it came).
  std::string probe_script() const {
    return "PROBE_READY_DIR=" + tmp_.path() + " exec " SIGTERM_PROBE;
  }
  bool probes_ready(int ranks) const {
    return wait_until(
        [&] {
          for (int r = 0; r < ranks; ++r) {
            if (!file_exists(tmp_.file("ready_" + std::to_string(r)))) return false;
          }
          return true;
        },
        20);
  }

  // The pid of the rank `rank`'s process named `comm`, once it exists.
  pid_t find_rank(int rank, const std::string& comm) {
    pid_t found = -1;
    wait_until(
        [&] {
          for (pid_t pid : processes_with_marker(token_)) {
            if (comm_of(pid) == comm && environ_value(pid, "RANK") == std::to_string(rank))
              found = pid;
          }
          return found > 0;
        },
        20);
    return found;
  }

  // Ranks 0..ranks-1 (2 per host) each printed "probe: <said>" (sigterm_probe.cpp) in `output`.
  void expect_probes_said(const std::string& output, int ranks, const std::string& said) const {
    for (int rank = 0; rank < ranks; ++rank) {
      const std::string line =
          "[" + host(rank / 2) + ":" + std::to_string(rank) + "] probe: " + said;
      EXPECT_NE(output.find(line), std::string::npos) << line << "\n" << output;
    }
  }
};

TEST_F(LaunchSshTest, TwoNodesTwoRanksEachGetTheirEnvironmentOnTheirHost) {
  std::string script =
      "echo \"ENV rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE lws=$LOCAL_WORLD_SIZE "
      "node=$NODE_RANK group=$GROUP_RANK master=$MASTER_ADDR:$MASTER_PORT "
      "cvd=$CUDA_VISIBLE_DEVICES ns=$(ip netns identify $$) pwd=$PWD\"; "
      "printf 'NCCL=%s|EXTRA=%s\\n' \"$NCCL_TEST_VALUE\" \"$EXTRA\"";
  RunResult r =
      run_dstrain(args(script, {"--master-port", "29555", "--env", "EXTRA=x;y $(z)"}), env(), 60);
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::string cwd = std::filesystem::current_path().string();
  for (int rank = 0; rank < 4; ++rank) {
    int node = rank / 2;
    std::string prefix = "[" + host(node) + ":" + std::to_string(rank) + "] ";
    std::string expected =
        prefix + "ENV rank=" + std::to_string(rank) + " local=" + std::to_string(rank % 2) +
        " world=4 lws=2 node=" + std::to_string(node) + " group=" + std::to_string(node) +
        " master=" + host(0) + ":29555 cvd=0,1 ns=" + cluster_->namespace_name(node) +
        " pwd=" + cwd + "\n";
    EXPECT_NE(r.out.find(expected), std::string::npos) << expected << "\n---\n" << r.out;
    EXPECT_NE(r.out.find(prefix + "NCCL=a b'c$d|EXTRA=x;y $(z)\n"), std::string::npos) << r.out;
  }
  EXPECT_NE(r.err.find("all 2 node(s) exited 0"), std::string::npos) << r.err;
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10));
}

TEST_F(LaunchSshTest, KilledRankTearsDownEveryHost) {
  Child child = start_dstrain(args("echo up; exec sleep 1000"), env());
  pid_t victim = find_rank(3, "sleep");
  ASSERT_GT(victim, 0) << "rank 3 never started";
  EXPECT_EQ(netns_of(victim), cluster_->namespace_name(1));
  ASSERT_EQ(processes_with_marker(token_).size() >= 4u, true);
  ::kill(victim, SIGKILL);
  RunResult r = finish(child, 15);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10))
      << processes_with_marker(token_).size() << " process(es) survived";
  EXPECT_NE(r.err.find("node 1 (host " + host(1) + ", ranks 2-3) failed first"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("rank 3 failed on host " + host(1) + ": signal SIGKILL"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("(stopped by the launcher)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exit code 137"), std::string::npos) << r.err;
}

TEST_F(LaunchSshTest, FailingRankExitCodeAndLastLinesAreReported) {
  Child child = start_dstrain(
      args("if [ \"$RANK\" = 2 ]; then echo 'about to fail' >&2; sleep 1; exit 7; fi; "
           "exec sleep 1000"),
      env());
  RunResult r = finish(child, 30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_NE(r.err.find("[" + host(1) + ":2] about to fail"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 2 failed on host " + host(1) + ": exit code 7"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("about to fail"), r.err.rfind("about to fail")) << "tail not in summary";
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10));
}

TEST_F(LaunchSshTest, InterruptStopsEveryHost) {
  Child child = start_dstrain(args("exec sleep 1000"), env());
  ASSERT_GT(find_rank(0, "sleep"), 0);
  ASSERT_GT(find_rank(3, "sleep"), 0);
  ::kill(child.pid, SIGINT);
  RunResult r = finish(child, 15);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_NE(r.err.find("interrupted by SIGINT"), std::string::npos) << r.err;
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10));
}

// Why a rank was stopped crosses nodes: a rank killed on node 1 makes the root launcher tell node
// 0's agent "a rank failed", and that agent's ranks get the SIGTERM that says so (a rank's MLflow
// and TensorBoard runs end FAILED); an interrupt of the launcher stays a plain SIGTERM (KILLED).
TEST_F(LaunchSshTest, RanksOnEveryNodeLearnThatARankFailed) {
  Child child = start_dstrain(args(probe_script()), env());
  pid_t victim = -1;
  for (int rank = 0; rank < 4; ++rank) ASSERT_GT(victim = find_rank(rank, "sigterm_probe"), 0);
  ASSERT_TRUE(probes_ready(4));
  ::kill(victim, SIGKILL);  // rank 3, on node 1
  RunResult r = finish(child, 20);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  const std::string all = r.out + r.err;
  expect_probes_said(all, 3, "SIGTERM for a failed rank");
  EXPECT_NE(all.find("[" + host(0) + "] dstrain launch: stopped after"), std::string::npos) << all;
  EXPECT_NE(all.find("because a rank on another node failed"), std::string::npos) << all;
  EXPECT_EQ(all.find("plain SIGTERM"), std::string::npos) << all;
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10));
}

TEST_F(LaunchSshTest, InterruptedLauncherStopsRanksWithAPlainSigterm) {
  Child child = start_dstrain(args(probe_script()), env());
  ASSERT_TRUE(probes_ready(4));
  ::kill(child.pid, SIGINT);
  RunResult r = finish(child, 20);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  const std::string all = r.out + r.err;
  expect_probes_said(all, 4, "plain SIGTERM");
  EXPECT_EQ(all.find("for a failed rank"), std::string::npos) << all;
}

TEST_F(LaunchSshTest, LauncherKilledOutrightStillStopsRemoteRanks) {
  Child child = start_dstrain(args("exec sleep 1000"), env());
  ASSERT_GT(find_rank(3, "sleep"), 0);
  ::kill(child.pid, SIGKILL);  // no teardown by the launcher: the connections just drop
  finish(child, 5);
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10))
      << processes_with_marker(token_).size() << " process(es) survived";
}

TEST_F(LaunchSshTest, Usr1IsForwardedToEveryRank) {
  std::string script = "trap 'echo got USR1; exit 0' USR1; echo ready; while :; do sleep 0.1; done";
  Child child = start_dstrain(args(script), env());
  ASSERT_GT(find_rank(0, "sleep"), 0);
  ASSERT_GT(find_rank(3, "sleep"), 0);
  ::kill(child.pid, SIGUSR1);
  RunResult r = finish(child, 20);
  ASSERT_FALSE(r.timed_out) << r.out << r.err << read_text(cluster_->dir() + "/sshd_0.log");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 4; ++rank) {
    std::string line = "[" + host(rank / 2) + ":" + std::to_string(rank) + "] got USR1";
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
}

// Lost links: nothing closes when a link goes down, so only the keepalive notices (node_agent.h):
// the launcher within --ssh-keepalive, and the lost host's agent, which stops its own ranks.
TEST_F(LaunchSshTest, LinkDownIsDetectedWithinTheKeepaliveAndNamesTheHost) {
  const double keepalive = 2;
  Child child = start_dstrain(args("echo up; exec sleep 1000", {"--ssh-keepalive", "2"}), env());
  pid_t on_lost_host = find_rank(3, "sleep");
  ASSERT_GT(on_lost_host, 0) << "rank 3 never started";
  ASSERT_GT(find_rank(0, "sleep"), 0);
  std::string down = "ip link set " + cluster_->veth(1) + " down";
  ASSERT_EQ(std::system(down.c_str()), 0) << down;
  auto t0 = std::chrono::steady_clock::now();
  RunResult r = finish(child, 20);
  double detected = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_LE(detected, keepalive + 1.5) << "the launcher ended " << detected << " s after the link";
  EXPECT_EQ(r.exit_code, 255) << r.err;
  EXPECT_NE(r.err.find("node 1 (host " + host(1) + ", ranks 2-3) failed first"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("host lost: nothing from it for 2 s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("(stopped by the launcher)"), std::string::npos) << r.err;
  // Host 0 was stopped by the launcher; host 1, cut off, by its own agent's keepalive.
  EXPECT_TRUE(wait_until(
      [&] {
        for (pid_t pid : processes_with_marker(token_)) {
          if (netns_of(pid) == cluster_->namespace_name(0)) return false;
        }
        return true;
      },
      5));
  EXPECT_TRUE(wait_until([&] { return !is_alive(on_lost_host); }, keepalive + 5))
      << "rank 3 still runs on the host whose link is down";
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10))
      << processes_with_marker(token_).size() << " process(es) of the job survived";
}

TEST_F(LaunchSshTest, KilledSshdIsDetectedAtOnceAndNamesTheHost) {
  Child child = start_dstrain(args("echo up; exec sleep 1000"), env());
  ASSERT_GT(find_rank(3, "sleep"), 0) << "rank 3 never started";
  ASSERT_GT(find_rank(0, "sleep"), 0);
  // Every sshd on host 1: the listener and this job's session (its monitor and its child).
  for (int pid : cluster_->processes_on(1)) {
    if (comm_of(pid) == "sshd") ::kill(pid, SIGKILL);
  }
  ::kill(cluster_->sshd_pid(1), SIGKILL);
  RunResult r = finish(child, 15);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 255) << r.err;
  EXPECT_NE(r.err.find("node 1 (host " + host(1) + ", ranks 2-3) failed first"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("connection lost"), std::string::npos) << r.err;
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10))
      << processes_with_marker(token_).size() << " process(es) of the job survived";
}

TEST_F(LaunchSshTest, UnreachableHostIsAClearErrorWithinTheTimeout) {
  std::ofstream(hostfile_) << host(0) << ":" << cluster_->port() << " slots=1\n"
                           << cluster_->unused_address() << ":" << cluster_->port() << " slots=1\n";
  RunResult r = run_dstrain(args("exec sleep 1000", {"--ssh-timeout", "3"}), env(), 30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 255) << r.err;
  EXPECT_NE(r.err.find("node 1 (host " + cluster_->unused_address()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cannot connect"), std::string::npos) << r.err;
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10));
}

TEST_F(LaunchSshTest, WrongKeyIsAClearError) {
  std::vector<std::string> a = args("true");
  a[4] = cluster_->wrong_key();
  RunResult r = run_dstrain(a, env(), 30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 255) << r.err;
  EXPECT_NE(r.err.find("public key authentication was refused"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(cluster_->wrong_key()), std::string::npos) << r.err;
}

TEST_F(LaunchSshTest, UnknownHostKeyIsRefusedUnlessAccepted) {
  std::string known = tmp_.file("known_hosts");
  std::ofstream(known).flush();
  std::vector<std::string> a = args("true");
  a[6] = known;
  RunResult r = run_dstrain(a, env(), 30);
  EXPECT_EQ(r.exit_code, 255) << r.err;
  EXPECT_NE(r.err.find("is not in " + known), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--ssh-accept-new-host-keys"), std::string::npos) << r.err;

  a.insert(a.begin() + 1, "--ssh-accept-new-host-keys");
  r = run_dstrain(a, env(), 30);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(read_text(known).find(host(1)), std::string::npos);
}

TEST_F(LaunchSshTest, MissingRemoteDirectoryNamesTheHost) {
  RunResult r = run_dstrain(args("true", {"--remote-cwd", "/nonexistent/dstrain dir"}), env(), 30);
  EXPECT_EQ(r.exit_code, 126) << r.err;
  EXPECT_NE(
      r.err.find("[" + host(0) +
                 "] dstrain launch: the working directory /nonexistent/dstrain dir does not exist"),
      std::string::npos)
      << r.err;
}

// The real thing: `dstrain train` on two hosts, one rank each, rendezvous over the bridge.
TEST_F(LaunchSshTest, TwoNodeTrainingJobRuns) {
  std::ofstream(hostfile_) << host(0) << ":" << cluster_->port() << " slots=2\n"
                           << host(1) << ":" << cluster_->port() << " slots=2\n";
  JobSpec spec;
  spec.nproc = 4;
  spec.max_steps = 6;
  std::string config = write_job_config(tmp_.path(), spec);
  RunResult r = run_dstrain({"launch", "--hostfile", hostfile_, "--ssh-key", cluster_->client_key(),
                             "--ssh-known-hosts", cluster_->known_hosts(), "--env",
                             std::string("GLOO_SOCKET_IFNAME=") + SshCluster::kInterface, config},
                            env(), 150);
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(read_metric(tmp_.file("run/metrics.jsonl"), "train/loss").size(), 6u) << r.out;
  EXPECT_NE(r.err.find("all 2 node(s) exited 0"), std::string::npos) << r.err;
  // 2 nodes x 2 ranks: the world is 4 and rank 0 (on the first host) reports it.
  EXPECT_NE(r.out.find("4 rank(s)"), std::string::npos) << r.out;
}

// Node-local staging (launcher/stage_inputs.h): every host copies the model and the token cache
// to its own disk (SshCluster::local_dir(), a different directory on each host) before its ranks
// start; a second launch copies nothing. In the root namespace local_dir() is an empty directory,
// so a rank that reads a file under it reads its own host's copy.
class LaunchStageTest : public LaunchSshTest {
 protected:
  std::vector<std::string> stage_args(const std::string& config, const std::string& hostfile) {
    return {"launch",
            "--hostfile",
            hostfile,
            "--ssh-key",
            cluster_->client_key(),
            "--ssh-known-hosts",
            cluster_->known_hosts(),
            "--env",
            std::string("GLOO_SOCKET_IFNAME=") + SshCluster::kInterface,
            "--stage-dir",
            cluster_->local_dir() + "/stage",
            config,
            "--set",
            "model.name_or_path=" + tmp_.file("model")};
  }

  std::string hostfile_starting_at(int first) {
    std::string path = tmp_.file("hosts_" + std::to_string(first));
    std::ofstream out(path);
    for (int k : {first, 1 - first}) out << host(k) << ":" << cluster_->port() << " slots=1\n";
    return path;
  }

  size_t blobs_on(int k) {
    size_t n = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(
             cluster_->host_local_dir(k) + "/stage/blobs/sha256", ec)) {
      if (e.is_regular_file()) ++n;
    }
    return n;
  }
};

TEST_F(LaunchStageTest, FirstLaunchCopiesSecondReusesAndRanksReadTheLocalCopy) {
  std::filesystem::create_directories(tmp_.file("model"));
  std::filesystem::copy_file(std::string(DSTRAIN_SOURCE_DIR) + "/configs/models/tiny/config.json",
                             tmp_.file("model/config.json"));
  JobSpec spec;
  spec.max_steps = 2;
  spec.save_final = true;
  std::string config = write_job_config(tmp_.path(), spec);
  // The shared token cache, made by a plain local run: staging copies what exists.
  RunResult made =
      run_dstrain({"launch", "--nproc", "1", config, "--set",
                   "model.name_or_path=" + tmp_.file("model"), "--set", "training.max_steps=1"},
                  env(), 120);
  ASSERT_EQ(made.exit_code, 0) << made.out << made.err;

  const std::string local = cluster_->local_dir() + "/stage";
  RunResult first = run_dstrain(stage_args(config, hostfile_starting_at(0)), env(), 150);
  ASSERT_FALSE(first.timed_out) << first.err;
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  for (int k = 0; k < 2; ++k) {
    // config.json, and the token cache entry (tokens + description)
    std::string line = "[" + host(k) + "] stage: node " + host(k) + ": copied 3 files (";
    EXPECT_NE(first.err.find(line), std::string::npos) << line << "\n" << first.err;
    EXPECT_EQ(blobs_on(k), 3u) << "host " << k;
  }
  EXPECT_NE(first.err.find("reused 0 (0 B)"), std::string::npos) << first.err;
  // Rank 0 (on host 0) read the model and the tokens from its node-local copy.
  EXPECT_NE(first.out.find("reading the node-local copy " + local + "/models/"), std::string::npos)
      << first.out;
  EXPECT_NE(first.out.find("tokens from the node-local copy " + local + "/data/"),
            std::string::npos)
      << first.out;

  // Rank 0 on host 1 this time: its reads of local_dir() can only be host 1's own disk.
  RunResult second = run_dstrain(stage_args(config, hostfile_starting_at(1)), env(), 150);
  ASSERT_FALSE(second.timed_out) << second.err;
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  for (int k = 0; k < 2; ++k) {
    std::string line =
        "[" + host(k) + "] stage: node " + host(k) + ": copied 0 files (0 B), reused 3 (";
    EXPECT_NE(second.err.find(line), std::string::npos) << line << "\n" << second.err;
    EXPECT_EQ(blobs_on(k), 3u) << "host " << k;
  }
  EXPECT_NE(second.out.find("[" + host(1) + ":0] "), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("reading the node-local copy " + local + "/models/"), std::string::npos)
      << second.out;
  EXPECT_NE(second.out.find("tokens from the node-local copy " + local + "/data/"),
            std::string::npos)
      << second.out;
  EXPECT_TRUE(std::filesystem::is_empty(cluster_->local_dir())) << "staged outside the hosts";
  // Outputs stay on shared storage and name the model as the config does.
  EXPECT_EQ(read_metric(tmp_.file("run/metrics.jsonl"), "train/loss").size(), 2u);
  std::string tag = read_text(tmp_.file("ckpt/latest"));
  while (!tag.empty() && tag.back() == '\n') tag.pop_back();
  std::string saved = read_text(tmp_.file("ckpt/" + tag + "/config.yaml"));
  EXPECT_NE(saved.find("name_or_path: \"" + tmp_.file("model") + "\"\n"), std::string::npos)
      << saved;
}

TEST_F(LaunchStageTest, UnusableStageDirIsOneErrorNamingNodeAndPathAndNoRankTrains) {
  std::filesystem::create_directories(tmp_.file("model"));
  std::filesystem::copy_file(std::string(DSTRAIN_SOURCE_DIR) + "/configs/models/tiny/config.json",
                             tmp_.file("model/config.json"));
  std::string config = write_job_config(tmp_.path(), JobSpec{});
  // Host 1's disk holds a file where the stage directory should go.
  std::ofstream(cluster_->host_local_dir(1) + "/stage") << "not a directory";
  RunResult r = run_dstrain(stage_args(config, hostfile_starting_at(0)), env(), 60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(
      r.err.find("stage: node " + host(1) + ": cannot write " + cluster_->local_dir() + "/stage: "),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("node 1 (host " + host(1) + ", ranks 1-1) failed first"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.out.find("step"), std::string::npos) << "a rank trained: " << r.out;
  EXPECT_FALSE(std::filesystem::exists(tmp_.file("run/metrics.jsonl")));
}

TEST_F(LaunchSshTest, DryRunCheckReportsEveryHost) {
  RunResult r = run_dstrain(args("true", {"--dry-run", "--check"}), env(), 30);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int k = 0; k < 2; ++k) {
    // The front end, then the worker with LibTorch and the devices of the host's 1 rank.
    EXPECT_NE(r.out.find("check " + host(k) + ": reachable; dstrain "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("; LibTorch "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("host " + host(k) + " (node " + std::to_string(k)), std::string::npos);
  }
}

}  // namespace
}  // namespace dstrain::testing
