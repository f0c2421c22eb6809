// A rank for the launcher tests that reports why it was stopped: it waits for SIGTERM and prints
// "probe: SIGTERM for a failed rank" when the signal carries the launcher's "another rank failed"
// value (core/teardown_signal.h), "probe: plain SIGTERM" otherwise, then exits 143. It prints
// "probe: ready" once SIGTERM is blocked, and gives up after 600 s.

#include <signal.h>
#include <unistd.h>
#include <cstdio>
#include <ctime>

#include "core/teardown_signal.h"

int main() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  if (sigprocmask(SIG_BLOCK, &set, nullptr) != 0) return 1;
  std::printf("probe: ready\n");
  std::fflush(stdout);
  siginfo_t info{};
  const timespec limit{600, 0};
  if (sigtimedwait(&set, &info, &limit) != SIGTERM) return 1;
  std::printf("probe: %s\n", dstrain::is_teardown_for_failed_rank(&info)
                                 ? "SIGTERM for a failed rank"
                                 : "plain SIGTERM");
  std::fflush(stdout);
  return 128 + SIGTERM;
}
