#pragma once
// How a rank ended, decoded from a wait status, and the launcher exit code that reports it:
// a rank's own exit code, or 128 + signal number for a signal (the shell convention).

#include <string>

namespace dstrain::launcher {

struct RankExit {
  bool signaled = false;
  int code = 0;    // exit code when !signaled
  int signal = 0;  // signal number when signaled

  bool ok() const { return !signaled && code == 0; }
};

// Decodes waitid()'s siginfo: child_code is si_code, CLD_EXITED (child_status = si_status is the
// exit code) or CLD_KILLED / CLD_DUMPED (child_status is the signal). Stopped/continued codes are
// not exits and must not be passed.
RankExit decode_child_status(int child_code, int child_status);

// "SIGKILL", "SIGTERM", ...; "signal N" for a number without a name.
std::string signal_name(int signal);

// "exit code 3" or "signal SIGKILL (9)".
std::string describe(const RankExit& exit);

// 0..255: the code itself, or 128 + signal.
int shell_exit_code(const RankExit& exit);

}  // namespace dstrain::launcher
