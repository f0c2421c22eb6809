// A rank for the launcher tests that reports why it was stopped: it waits for SIGTERM, then reads
// its teardown pipe (core/teardown_reason.h) and prints "probe: SIGTERM for a failed rank (<the
// launcher's description>)" when the launcher wrote there which rank failed, "probe: plain
// SIGTERM" otherwise, and exits 143. Once SIGTERM is blocked it prints "probe: ready" and, when
// PROBE_READY_DIR is set, creates the file ready_<RANK> there. It gives up after 600 s.

#include <signal.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>

#include "core/teardown_reason.h"

int main() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  if (sigprocmask(SIG_BLOCK, &set, nullptr) != 0) return 1;
  const int reason_fd = dstrain::teardown::reason_fd_from_env();
  std::printf("probe: ready\n");
  std::fflush(stdout);
  const char* ready_dir = std::getenv("PROBE_READY_DIR");
  const char* rank = std::getenv("RANK");
  if (ready_dir != nullptr && rank != nullptr) {
    std::FILE* ready = std::fopen((std::string(ready_dir) + "/ready_" + rank).c_str(), "w");
    if (ready == nullptr) return 1;
    std::fclose(ready);
  }
  siginfo_t info{};
  const timespec limit{600, 0};
  if (sigtimedwait(&set, &info, &limit) != SIGTERM) return 1;
  if (const auto failure = dstrain::teardown::receive(reason_fd)) {
    std::printf("probe: SIGTERM for a failed rank (%s)\n",
                dstrain::teardown::describe(*failure).c_str());
  } else {
    std::printf("probe: plain SIGTERM\n");
  }
  std::fflush(stdout);
  return 128 + SIGTERM;
}
