#include "metrics/termination.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "core/teardown_reason.h"

namespace dstrain::metrics {
namespace {

using teardown::RankFailure;

// What the callback saw, as the child reports it on a pipe: the signal, then 'F' and the failure's
// description when the launcher said a rank failed, 'K' alone when it did not.
std::string report_of(int signo, const std::optional<RankFailure>& failure) {
  std::string text(1, static_cast<char>(signo));
  return text + (failure ? "F" + teardown::describe(*failure) : std::string("K"));
}

// Plays the launcher against a forked rank that holds a TerminationWatch: once the watch is up,
// writes `told` (if any) on the rank's teardown pipe (none at all with `no_pipe`), then sends
// `signo` `times` times, plain kill()s as to a process group. Expects the callback to have seen
// what `told` says and the rank to die by the signal itself, as it would have without the watch.
void expect_stop(int signo, const std::optional<RankFailure>& told, int times = 1,
                 bool no_pipe = false) {
  int report[2];
  int reason[2];
  ASSERT_EQ(::pipe(report), 0);
  ASSERT_EQ(::pipe(reason), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(report[0]);
    ::close(reason[1]);
    TerminationWatch watch(
        [&](int s, const std::optional<RankFailure>& failure) {
          const std::string text = report_of(s, failure);
          [[maybe_unused]] ssize_t n = ::write(report[1], text.data(), text.size());
          ::close(report[1]);
        },
        no_pipe ? -1 : reason[0]);
    [[maybe_unused]] ssize_t n = ::write(report[1], "R", 1);  // the watch is up
    std::this_thread::sleep_for(std::chrono::seconds(10));
    ::_exit(0);  // not reached
  }
  ::close(report[1]);
  ::close(reason[0]);
  char ready = 0;
  ASSERT_EQ(::read(report[0], &ready, 1), 1);
  if (told) {
    ASSERT_TRUE(teardown::send(reason[1], *told));
  }
  for (int i = 0; i < times; ++i) ::kill(pid, signo);
  std::string got;
  char buf[256];
  for (ssize_t n; (n = ::read(report[0], buf, sizeof buf)) > 0;) got.append(buf, n);
  EXPECT_EQ(got, report_of(signo, told));
  ::close(report[0]);
  ::close(reason[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << status;
  EXPECT_EQ(WTERMSIG(status), signo);
}

TEST(TerminationWatch, SigtermRunsTheCallbackThenEndsTheProcessBySigterm) {
  expect_stop(SIGTERM, std::nullopt);
}

TEST(TerminationWatch, SigintRunsTheCallbackThenEndsTheProcessBySigint) {
  expect_stop(SIGINT, std::nullopt);
}

TEST(TerminationWatch, WithoutATeardownPipeEveryStopIsPlain) {
  expect_stop(SIGTERM, std::nullopt, 1, /*no_pipe=*/true);
}

// The launcher's order: the failed rank on the pipe, then plain SIGTERMs (one to the rank's process
// group from each teardown that reaches it). The signals carry nothing; which one a thread of the
// rank takes first does not matter, the reason is already there.
TEST(TerminationWatch, TheFailedRankWrittenBeforeThePlainSigtermsReachesTheCallback) {
  expect_stop(SIGTERM, RankFailure{3, "node7", "signal SIGKILL (9)"});
  expect_stop(SIGTERM, RankFailure{1, "node2", "exit code 1"}, /*times=*/2);
}

TEST(TerminationWatch, AFailureNotKnownInDetailStillCounts) {
  expect_stop(SIGTERM, RankFailure{});
}

TEST(TerminationWatch, DestroyingItRestoresThePreviousHandler) {
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  {
    TerminationWatch watch([](int, const std::optional<RankFailure>&) {}, -1);
  }
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(before.sa_handler, after.sa_handler);
}

}  // namespace
}  // namespace dstrain::metrics
