// One rank's lifetime (train/rank_lifetime.h) in a forked process playing the rank, this one
// playing its launcher: the heartbeat reaches the launcher's socket, a teardown for a failed rank
// is read and said on stderr by the rank, whatever rank it is, the run's registered end runs
// within what the grace leaves and the rank dies by the signal; SIGUSR1 only asks for a stop.
#include "train/rank_lifetime.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/liveness.h"
#include "core/teardown_reason.h"

namespace dstrain::train {
namespace {

using teardown::RankFailure;

std::string read_all(int fd) {
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  return got;
}

// Whether a datagram arrives on `fd` within `seconds`.
bool beats(int fd, double seconds) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(seconds * 1000)) != 1) return false;
  char byte[16];
  return ::recv(fd, byte, sizeof byte, 0) > 0;
}

struct Ended {
  std::string report;  // what the registered ends wrote
  std::string err;     // the rank's stderr
  int status = 0;
};

// Forks a rank that holds a RankLifetime (with a liveness socket, a teardown pipe and a grace of
// 10 s from its launcher) and registers two ends, the second dropped at once; once it is up,
// checks that it beats, writes `told` (if any) on its pipe and sends SIGTERM.
Ended stop_rank(const std::optional<RankFailure>& told) {
  int report[2], reason[2], err[2], live[2];
  EXPECT_EQ(::pipe(report), 0);
  EXPECT_EQ(::pipe(reason), 0);
  EXPECT_EQ(::pipe(err), 0);
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM, 0, live), 0);
  const pid_t pid = ::fork();
  EXPECT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(err[1], STDERR_FILENO);
    ::close(report[0]);
    ::close(reason[1]);
    ::close(live[0]);
    ::setenv(liveness::kLivenessFdVar, std::to_string(live[1]).c_str(), 1);
    ::setenv(teardown::kTeardownFdVar, std::to_string(reason[0]).c_str(), 1);
    ::setenv(teardown::kGraceVar, "10", 1);
    RankLifetime lifetime;
    const RankLifetime::EndHandle kept =
        lifetime.on_end([&](int, const std::optional<RankFailure>& failure, double seconds) {
          const std::string text = (failure ? "failed " : "stopped ") + std::to_string(seconds);
          [[maybe_unused]] ssize_t n = ::write(report[1], text.data(), text.size());
        });
    {
      const RankLifetime::EndHandle dropped =
          lifetime.on_end([&](int, const std::optional<RankFailure>&, double) {
            [[maybe_unused]] ssize_t n = ::write(report[1], " dropped", 8);
          });
    }
    [[maybe_unused]] ssize_t n = ::write(report[1], "R", 1);  // up
    std::this_thread::sleep_for(std::chrono::seconds(20));
    ::_exit(0);  // not reached
  }
  ::close(report[1]);
  ::close(reason[0]);
  ::close(err[1]);
  ::close(live[1]);
  Ended out;
  char up = 0;
  EXPECT_EQ(::read(report[0], &up, 1), 1);
  EXPECT_TRUE(beats(live[0], 2)) << "no heartbeat within 2 s";
  if (told) {
    EXPECT_TRUE(teardown::send(reason[1], *told));
  }
  ::kill(pid, SIGTERM);
  out.report = read_all(report[0]);
  out.err = read_all(err[0]);
  EXPECT_EQ(::waitpid(pid, &out.status, 0), pid);
  for (int fd : {report[0], reason[1], err[0], live[0]}) ::close(fd);
  return out;
}

TEST(RankLifetime, ARankStoppedForAFailedRankSaysWhichAndRunsTheRunsEnd) {
  const Ended e = stop_rank(RankFailure{3, "node7", "exit code 1"});
  EXPECT_EQ(e.report, "failed 7.500000") << "10 s of grace less 2.5 s; the dropped end not run";
  EXPECT_NE(e.err.find("Terminated (the launcher stops the job: rank 3 on node7 failed: exit code "
                       "1): stopping"),
            std::string::npos)
      << e.err;
  ASSERT_TRUE(WIFSIGNALED(e.status)) << "exit status " << e.status;
  EXPECT_EQ(WTERMSIG(e.status), SIGTERM);
}

TEST(RankLifetime, ARankStoppedWithoutAFailureSaysTheJobWasStopped) {
  const Ended e = stop_rank(std::nullopt);
  EXPECT_EQ(e.report, "stopped 7.500000");
  EXPECT_NE(e.err.find("Terminated (the job was stopped): stopping"), std::string::npos) << e.err;
  ASSERT_TRUE(WIFSIGNALED(e.status));
  EXPECT_EQ(WTERMSIG(e.status), SIGTERM);
}

// SIGUSR1 sets the stop request and nothing else; the lifetime's end puts the default back.
TEST(RankLifetime, SigusrOneAsksForAStop) {
  {
    RankLifetime lifetime;
    RankLifetime::stop_requested().store(false);
    ASSERT_EQ(::raise(SIGUSR1), 0);
    EXPECT_TRUE(RankLifetime::stop_requested().load());
    RankLifetime::stop_requested().store(false);
  }
  struct sigaction now {};
  sigaction(SIGUSR1, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
}

// What the end of a run may take after a signal: the launcher's grace less 2.5 s, at least half
// of it, at most 30 s; 2.5 s without a launcher.
TEST(RankLifetime, TheEndTakesWhatTheGraceLeaves) {
  const auto with_grace = [](const char* grace) {
    if (grace != nullptr) {
      ::setenv(teardown::kGraceVar, grace, 1);
    } else {
      ::unsetenv(teardown::kGraceVar);
    }
    const double seconds = RankLifetime().end_seconds();
    ::unsetenv(teardown::kGraceVar);
    return seconds;
  };
  EXPECT_EQ(with_grace(nullptr), 2.5);
  EXPECT_EQ(with_grace("5"), 2.5);
  EXPECT_EQ(with_grace("2"), 1.0);
  EXPECT_EQ(with_grace("100"), 30.0);
}

}  // namespace
}  // namespace dstrain::train
