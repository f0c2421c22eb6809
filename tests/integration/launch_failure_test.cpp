// `dstrain launch` when things go wrong: a rank fails or is killed, ranks ignore SIGTERM, the
// launcher is interrupted or killed. In every case no process of the job may survive: each test
// tags its processes with a unique DSTRAIN_TEST_MARKER in their environment and checks the process
// table, and checks the pids the ranks recorded (ranks and the grandchildren they started).

#include <csignal>
#include <string>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"

namespace dstrain::testing {
namespace {

// Shell: start a grandchild sleeper in the rank's process group, record both pids, mark readiness.
const char* kStartSleepers =
    "sleep 1000 & echo $! > \"$D/child_$RANK\"; echo $$ > \"$D/pid_$RANK\"; "
    "touch \"$D/ready_$RANK\"; ";

// Shell: wait (bounded, ~20 s) until ranks 0..n-1 other than this one are ready.
std::string wait_for_others(int n) {
  std::string s = "i=0; for r in";
  for (int r = 0; r < n; ++r) s += " " + std::to_string(r);
  return s +
         "; do while [ \"$r\" != \"$RANK\" ] && [ ! -f \"$D/ready_$r\" ] && [ $i -lt 400 ]; "
         "do sleep 0.05; i=$((i+1)); done; done; ";
}

class LaunchFailure : public ::testing::Test {
 protected:
  std::vector<std::string> env() const {
    return {"D=" + dir_.path(), "DSTRAIN_TEST_MARKER=" + token_};
  }

  bool all_ready(int n) const {
    for (int r = 0; r < n; ++r) {
      if (!file_exists(dir_.file("ready_" + std::to_string(r)))) return false;
    }
    return true;
  }

  // No process of the job is left: none carries the marker, none of the recorded pids lives.
  // Both are waited for: a process in the middle of exiting has already lost its environment
  // (no marker to find) but is not yet a zombie.
  void expect_no_survivors(int n) const {
    std::vector<pid_t> recorded;
    for (int r = 0; r < n; ++r) {
      for (std::string kind : {"pid_", "child_"}) {
        std::string text = read_text(dir_.file(kind + std::to_string(r)));
        if (!text.empty()) recorded.push_back(std::stoi(text));
      }
    }
    auto recorded_alive = [&] {
      std::vector<pid_t> alive;
      for (pid_t pid : recorded) {
        if (is_alive(pid)) alive.push_back(pid);
      }
      return alive;
    };
    bool gone = wait_until(
        [&] { return processes_with_marker(token_).empty() && recorded_alive().empty(); }, 5.0);
    std::string alive;
    for (pid_t pid : recorded_alive()) alive += " " + std::to_string(pid);
    EXPECT_TRUE(gone) << processes_with_marker(token_).size()
                      << " processes of the job survive; recorded pids still alive:" << alive;
  }

  TempDir dir_;
  std::string token_ = unique_token();
};

TEST_F(LaunchFailure, FirstFailingRankStopsAllOthersAndSetsTheExitCode) {
  std::string script = std::string(kStartSleepers) + "if [ \"$RANK\" = 3 ]; then " +
                       wait_for_others(4) + "echo 'rank three is failing'; exit 3; fi; wait";
  RunResult r =
      run_dstrain({"launch", "--nproc", "4", "--exec", "--", "sh", "-c", script}, env(), 30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 3 failed on host localhost")) << r.err;
  EXPECT_TRUE(contains(r.err, "exit code 3")) << r.err;
  EXPECT_TRUE(contains(r.err, "| rank three is failing")) << r.err;
  EXPECT_TRUE(contains(r.err, "(stopped by the launcher)")) << r.err;
  expect_no_survivors(4);
}

TEST_F(LaunchFailure, RankKilledBySignalIsReportedAs128PlusSignal) {
  std::string script = std::string(kStartSleepers) + "if [ \"$RANK\" = 1 ]; then " +
                       wait_for_others(2) + "kill -9 $$; fi; wait";
  RunResult r =
      run_dstrain({"launch", "--nproc", "2", "--exec", "--", "sh", "-c", script}, env(), 30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 137) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 1 failed")) << r.err;
  EXPECT_TRUE(contains(r.err, "SIGKILL")) << r.err;
  expect_no_survivors(2);
}

TEST_F(LaunchFailure, RanksIgnoringSigtermAreKilledAfterTheGrace) {
  // Ranks 1 and 2 ignore SIGTERM (the ignored disposition survives exec into sleep).
  std::string script =
      "if [ \"$RANK\" = 0 ]; then " + wait_for_others(3) +
      "exit 5; fi; trap '' TERM; echo $$ > \"$D/pid_$RANK\"; touch \"$D/ready_$RANK\"; "
      "exec sleep 1000";
  RunResult r = run_dstrain(
      {"launch", "--nproc", "3", "--grace", "1", "--exec", "--", "sh", "-c", script}, env(), 30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0 failed")) << r.err;
  EXPECT_TRUE(contains(r.err, "signal SIGKILL (9)  (stopped by the launcher)")) << r.err;
  expect_no_survivors(3);
}

TEST_F(LaunchFailure, SucceedingRanksLeaveNoBackgroundProcesses) {
  std::string script = std::string(kStartSleepers) + "exit 0";
  RunResult r =
      run_dstrain({"launch", "--nproc", "2", "--exec", "--", "sh", "-c", script}, env(), 30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  expect_no_survivors(2);
}

// How often `needle` occurs in `text`.
int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Ranks that exec sigterm_probe (it prints why it was stopped) once it can take SIGTERM.
const std::string kExecProbe = "PROBE_READY_DIR=\"$D\" exec " SIGTERM_PROBE;

// The ranks still running are told which rank failed, and how, before their SIGTERM
// (core/teardown_reason.h): their tracked runs end FAILED, not KILLED.
TEST_F(LaunchFailure, RanksStillRunningAreToldWhichRankFailed) {
  std::string script =
      "if [ \"$RANK\" = 2 ]; then " + wait_for_others(3) + "exit 3; fi; " + kExecProbe;
  RunResult r =
      run_dstrain({"launch", "--nproc", "3", "--exec", "--", "sh", "-c", script}, env(), 30);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 3) << r.err;
  const std::string all = r.out + r.err;
  EXPECT_EQ(
      count_of(all, "probe: SIGTERM for a failed rank (rank 2 on localhost failed: exit code 3)"),
      2)
      << all;
  EXPECT_EQ(count_of(all, "plain SIGTERM"), 0) << all;
  expect_no_survivors(3);
}

TEST_F(LaunchFailure, AnInterruptedLauncherTellsTheRanksNoRankFailed) {
  Child launcher =
      start_dstrain({"launch", "--nproc", "3", "--exec", "--", "sh", "-c", kExecProbe}, env());
  bool ready = wait_until([&] { return all_ready(3); }, 15.0);
  if (ready) ::kill(launcher.pid, SIGINT);
  RunResult r = finish(launcher, ready ? 20 : 0);
  ASSERT_TRUE(ready) << "ranks did not start: " << r.err;
  ASSERT_FALSE(r.timed_out) << r.err;
  const std::string all = r.out + r.err;
  EXPECT_EQ(count_of(all, "probe: plain SIGTERM"), 3) << all;
  EXPECT_EQ(count_of(all, "for a failed rank"), 0) << all;
  expect_no_survivors(3);
}

class LaunchSignal : public LaunchFailure, public ::testing::WithParamInterface<int> {};

TEST_P(LaunchSignal, SignalToLauncherStopsAllRanks) {
  int sig = GetParam();
  std::string script = std::string(kStartSleepers) + "wait";
  Child launcher =
      start_dstrain({"launch", "--nproc", "3", "--exec", "--", "sh", "-c", script}, env());
  bool ready = wait_until([&] { return all_ready(3); }, 15.0);
  if (ready) ::kill(launcher.pid, sig);
  RunResult r = finish(launcher, ready ? 20 : 0);
  ASSERT_TRUE(ready) << "ranks did not start: " << r.err;
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 128 + sig) << r.err;
  EXPECT_TRUE(
      contains(r.err, std::string("interrupted by ") + (sig == SIGINT ? "SIGINT" : "SIGTERM")))
      << r.err;
  expect_no_survivors(3);
}

INSTANTIATE_TEST_SUITE_P(SigtermAndSigint, LaunchSignal, ::testing::Values(SIGTERM, SIGINT),
                         [](const auto& info) {
                           return info.param == SIGTERM ? "SIGTERM" : "SIGINT";
                         });

TEST_F(LaunchFailure, SigkillToTheLauncherLeavesNoOrphans) {
  std::string script = std::string(kStartSleepers) + "wait";
  Child launcher =
      start_dstrain({"launch", "--nproc", "3", "--exec", "--", "sh", "-c", script}, env());
  bool ready = wait_until([&] { return all_ready(3); }, 15.0);
  ::kill(launcher.pid, SIGKILL);
  RunResult r = finish(launcher, 10);
  ASSERT_TRUE(ready) << "ranks did not start: " << r.err;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  expect_no_survivors(3);
}

}  // namespace
}  // namespace dstrain::testing
