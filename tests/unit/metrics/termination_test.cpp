#include "metrics/termination.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace dstrain::metrics {
namespace {

// In a child: the callback runs (it writes to a pipe the parent reads) and the process then dies by
// the signal itself, as it would have without the watch.
void expect_callback_then_death_by(int signo) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    TerminationWatch watch([&](int s) {
      const char c = static_cast<char>(s);
      [[maybe_unused]] ssize_t n = ::write(fds[1], &c, 1);
    });
    ::kill(::getpid(), signo);
    std::this_thread::sleep_for(std::chrono::seconds(10));
    ::_exit(0);  // not reached
  }
  ::close(fds[1]);
  char got = 0;
  EXPECT_EQ(::read(fds[0], &got, 1), 1);
  EXPECT_EQ(got, static_cast<char>(signo));
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

TEST(TerminationWatch, DestroyingItRestoresThePreviousHandler) {
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  {
    TerminationWatch watch([](int) {});
  }
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(before.sa_handler, after.sa_handler);
}

}  // namespace
}  // namespace dstrain::metrics
