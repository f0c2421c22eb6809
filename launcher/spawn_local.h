#pragma once
// Starting one rank as a local child process.
//
// The child gets: its own process group (setpgid, so teardown can signal the rank and everything it
// started, and a terminal Ctrl-C reaches only the launcher, which forwards it); SIGKILL when the
// launcher dies for any reason (PR_SET_PDEATHSIG, re-checked with getppid() against the race where
// the launcher died before the prctl); stdin from /dev/null; stdout and stderr into pipes the
// launcher reads; descriptor 3 (DSTRAIN_LIVENESS_FD) a datagram socket for its heartbeat
// (core/liveness.h); descriptor 4 (DSTRAIN_TEARDOWN_FD) the read end of a pipe on which the
// launcher says why it stops the rank (core/teardown_reason.h); default signal dispositions and an
// empty signal mask; the launcher's environment with the rank's variables on top. Everything the
// child needs is prepared before fork(), so the child only makes async-signal-safe calls.

#include <sys/types.h>

#include "launcher/plan.h"

namespace dstrain::launcher {

struct LocalProcess {
  pid_t pid = -1;      // also the process group id
  int stdout_fd = -1;  // read ends, non-blocking, close-on-exec; owned by the caller
  int stderr_fd = -1;
  int liveness_fd = -1;  // the launcher's end of the heartbeat socket, non-blocking, close-on-exec
  int teardown_fd = -1;  // the write end of the teardown pipe, non-blocking, close-on-exec
};

// Forks and execs `rank.argv` (argv[0] must be a path, see program_path.h). If exec fails the child
// writes the reason to its stderr pipe and exits 127, like a shell. Throws Error(kIo) when the
// pipes or the fork cannot be created.
LocalProcess spawn_local(const RankSpec& rank);

}  // namespace dstrain::launcher
