#include "metrics/termination.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "core/teardown_signal.h"

namespace dstrain::metrics {
namespace {

// In a child: the callback runs (it writes to a pipe the parent reads: the signal, and 'F' when the
// launcher said a peer rank failed) and the process then dies by the signal itself, as it would
// have without the watch. `queued_value`: send with sigqueue() and this value instead of kill().
// `plain_first`: a plain kill() of the same signal first, handled before the queued one is sent.
void expect_callback_then_death_by(int signo, int queued_value = 0, bool peer_failed = false,
                                   bool plain_first = false) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    TerminationWatch watch([&](int s, bool failed) {
      const char c[2] = {static_cast<char>(s), failed ? 'F' : 'K'};
      [[maybe_unused]] ssize_t n = ::write(fds[1], c, 2);
    });
    if (plain_first) ::kill(::getpid(), signo);  // handled before kill() returns
    if (queued_value != 0) {
      union sigval v {};
      v.sival_int = queued_value;
      ::sigqueue(::getpid(), signo, v);
    } else {
      ::kill(::getpid(), signo);
    }
    std::this_thread::sleep_for(std::chrono::seconds(10));
    ::_exit(0);  // not reached
  }
  ::close(fds[1]);
  char got[2] = {0, 0};
  EXPECT_EQ(::read(fds[0], got, 2), 2);
  EXPECT_EQ(got[0], static_cast<char>(signo));
  EXPECT_EQ(got[1], peer_failed ? 'F' : 'K');
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << status;
  EXPECT_EQ(WTERMSIG(status), signo);
}

TEST(TerminationWatch, SigtermRunsTheCallbackThenEndsTheProcessBySigterm) {
  expect_callback_then_death_by(SIGTERM);
}

TEST(TerminationWatch, SigintRunsTheCallbackThenEndsTheProcessBySigint) {
  expect_callback_then_death_by(SIGINT);
}

TEST(TerminationWatch, TheLaunchersFailedRankValueIsToldApart) {
  expect_callback_then_death_by(SIGTERM, kTeardownForFailedRank, /*peer_failed=*/true);
  expect_callback_then_death_by(SIGTERM, 12345, /*peer_failed=*/false);
}

TEST(TerminationWatch, TheFailedRankValueCountsWhenAPlainSigtermIsHandledFirst) {
  // The launcher's queued SIGTERM and its plain one to the process group, their handlers run on
  // two threads and writing in the other order: the run still ends as FAILED.
  expect_callback_then_death_by(SIGTERM, kTeardownForFailedRank, /*peer_failed=*/true,
                                /*plain_first=*/true);
}

TEST(TerminationWatch, DestroyingItRestoresThePreviousHandler) {
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  {
    TerminationWatch watch([](int, bool) {});
  }
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(before.sa_handler, after.sa_handler);
}

}  // namespace
}  // namespace dstrain::metrics
