#include "launcher/exit_status.h"

#include <sys/wait.h>
#include <csignal>

#include <fmt/format.h>

namespace dstrain::launcher {

RankExit decode_child_status(int child_code, int child_status) {
  RankExit exit;
  if (child_code == CLD_KILLED || child_code == CLD_DUMPED) {
    exit.signaled = true;
    exit.signal = child_status;
  } else {
    exit.code = child_status;
  }
  return exit;
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return fmt::format("signal {}", signal);
  }
}

std::string describe(const RankExit& exit) {
  if (exit.signaled) return fmt::format("signal {} ({})", signal_name(exit.signal), exit.signal);
  return fmt::format("exit code {}", exit.code);
}

int shell_exit_code(const RankExit& exit) {
  return exit.signaled ? 128 + exit.signal : exit.code;
}

}  // namespace dstrain::launcher
