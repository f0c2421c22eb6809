// The scale benchmark's checks (scripts/bench/launch-scale, run by hand at 64 hosts) at 8 hosts x 2
// ranks, on the same fixture (ssh_cluster.h): every rank runs within 2 s of the command; after one
// rank fails, every process on every host (ranks, agents, shells, SSH sessions; the sshd listeners
// excepted) is gone within 2 s; nothing is left on any host. Also: neither the launcher nor the
// node agents load LibTorch (apps/dstrain/command_info.h).

#include <sys/stat.h>
#include <unistd.h>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/integration/ssh_cluster.h"

namespace dstrain::testing {
namespace {

constexpr int kHosts = 8;
constexpr int kSlots = 2;
constexpr double kStartLimit = 2.0;
constexpr double kTeardownLimit = 2.0;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double mtime_seconds(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
}

bool maps_libtorch(int pid) {
  return read_text("/proc/" + std::to_string(pid) + "/maps").find("libtorch") != std::string::npos;
}

// /proc/<pid>/status "Threads:" value.
int thread_count(int pid) {
  std::string status = read_text("/proc/" + std::to_string(pid) + "/status");
  size_t at = status.find("Threads:");
  return at == std::string::npos ? 0 : std::atoi(status.c_str() + at + 8);
}

class LaunchScaleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason = SshCluster::skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    cluster_ = std::make_unique<SshCluster>(kHosts);
    std::ofstream(tmp_.file("hosts")) << cluster_->hostfile(kSlots);
    std::filesystem::create_directory(tmp_.file("up"));
    // Like the benchmark's rank: report that it runs (pid in up/<RANK>, atomically), then wait.
    std::ofstream(tmp_.file("rank.sh"))
        << "#!/bin/sh\necho $$ > \"$1/up/$RANK.tmp\" && mv \"$1/up/$RANK.tmp\" \"$1/up/$RANK\"\n"
        << "exec sleep 1000\n";
    ::chmod(tmp_.file("rank.sh").c_str(), 0755);
  }

  void TearDown() override {
    if (launcher_.pid > 0) finish(launcher_, 5);
    cluster_.reset();  // kills whatever is left on the hosts
  }

  int processes_left() const {
    int left = 0;
    for (int k = 0; k < kHosts; ++k) left += static_cast<int>(cluster_->processes_on(k).size());
    return left;
  }

  // The newest up/ file's mtime once all ranks wrote theirs, else 0.
  double all_ranks_running(double timeout) const {
    double newest = 0;
    bool all = wait_until(
        [&] {
          newest = 0;
          for (int r = 0; r < kHosts * kSlots; ++r) {
            double t = mtime_seconds(tmp_.file("up/" + std::to_string(r)));
            if (t == 0) return false;
            newest = std::max(newest, t);
          }
          return true;
        },
        timeout);
    return all ? newest : 0;
  }

  TempDir tmp_;
  std::unique_ptr<SshCluster> cluster_;
  Child launcher_;
};

TEST_F(LaunchScaleTest, EightHostsStartAndStopEverywhereWithinTwoSeconds) {
  double t0 = now_seconds();
  launcher_ = start_dstrain({"launch", "--hostfile", tmp_.file("hosts"), "--ssh-key",
                             cluster_->client_key(), "--ssh-known-hosts", cluster_->known_hosts(),
                             "--exec", "--", tmp_.file("rank.sh"), tmp_.path()});
  double newest = all_ranks_running(30);
  ASSERT_GT(newest, 0) << "not every rank started within 30 s";
  double start = newest - t0;
  EXPECT_LE(start, kStartLimit) << "all " << kHosts * kSlots << " ranks running after " << start
                                << " s";

  // The launcher and every node agent (and its group guard, a fork of it) run without LibTorch.
  EXPECT_FALSE(maps_libtorch(launcher_.pid));
  int hosts_with_agent = 0;
  for (int k = 0; k < kHosts; ++k) {
    bool agent = false;
    for (int pid : cluster_->processes_on(k)) {
      if (comm_of(pid) != "dstrain") continue;
      agent = true;
      EXPECT_FALSE(maps_libtorch(pid)) << "the node agent on host " << k << " loaded LibTorch";
    }
    hosts_with_agent += agent ? 1 : 0;
  }
  EXPECT_EQ(hosts_with_agent, kHosts);
  int threads = thread_count(launcher_.pid);
  EXPECT_LE(threads, kHosts + 2) << "one thread per host and the main thread";

  int victim = std::atoi(read_text(tmp_.file("up/" + std::to_string(kHosts * kSlots - 1))).c_str());
  ASSERT_GT(victim, 0);
  double t_fail = now_seconds();
  ::kill(victim, SIGKILL);
  bool gone = wait_until([&] { return processes_left() == 0; }, 10);
  double teardown = now_seconds() - t_fail;
  EXPECT_TRUE(gone) << processes_left() << " process(es) left on the hosts after 10 s";
  EXPECT_LE(teardown, kTeardownLimit)
      << "every process on every host gone after " << teardown << " s";
  for (int k = 0; k < kHosts; ++k) {
    EXPECT_EQ(cluster_->processes_on(k).size(), 0u) << "processes left on host " << k;
  }
  RunResult r = finish(launcher_, 10);
  launcher_.pid = -1;
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.err;
  EXPECT_NE(r.err.find("node " + std::to_string(kHosts - 1) + " (host " +
                       cluster_->address(kHosts - 1) + ", ranks 14-15) failed first"),
            std::string::npos)
      << r.err;
  std::printf(
      "[ MEASURED ] %d hosts x %d ranks: all running %.2f s, teardown %.2f s, launcher "
      "threads %d\n",
      kHosts, kSlots, start, teardown, threads);
}

}  // namespace
}  // namespace dstrain::testing
