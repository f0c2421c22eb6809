#include "launcher/spawn_local.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/liveness.h"
#include "core/teardown_reason.h"

extern char** environ;

namespace dstrain::launcher {
namespace {

// The launcher's environment with `overrides` replacing or adding variables.
std::vector<std::string> merged_environment(const EnvList& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& kv : overrides) replaced = replaced || kv.first == name;
    if (!replaced) env.push_back(std::move(entry));
  }
  for (const auto& kv : overrides) env.push_back(kv.first + "=" + kv.second);
  return env;
}

std::vector<char*> c_array(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void make_pipe(int fds[2], const char* what) {
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    fail(ErrorKind::kIo, "cannot create a pipe for a rank's {}: {}", what, std::strerror(errno));
  }
}

void write_str(int fd, const char* s) {
  ssize_t ignored = ::write(fd, s, std::strlen(s));
  (void)ignored;
}

// The child's ends of its pipes, and the descriptor each must become in the child.
struct ChildFds {
  static constexpr int kCount = 4;
  int from[kCount];  // stdout, stderr, heartbeat socket, teardown pipe (read end)
  static constexpr int kTo[kCount] = {1, 2, liveness::kLivenessFd, teardown::kTeardownFd};
};

// Moves the child's descriptors into place. Each is first copied above every target, so that
// moving one never overwrites another that still has to move (any of them may be 1 to 4). Returns
// the call that failed (errno set), or nullptr.
const char* place_descriptors(const ChildFds& fds) {
  constexpr int kAboveTargets = 10;
  int high[ChildFds::kCount];
  for (int i = 0; i < ChildFds::kCount; ++i) {
    high[i] = ::fcntl(fds.from[i], F_DUPFD_CLOEXEC, kAboveTargets);
    if (high[i] < 0) return "fcntl(F_DUPFD_CLOEXEC)";
  }
  for (int i = 0; i < ChildFds::kCount; ++i) {
    if (::dup2(high[i], ChildFds::kTo[i]) < 0) return "dup2";  // the copy is not close-on-exec
  }
  return nullptr;
}

// Writes "dstrain launch: <what><detail>: <strerror(err)>" to descriptor 2 (which is still the
// launcher's stderr, or already the rank's stderr pipe, depending on how far the child got).
void report_child_failure(const char* what, const char* detail, int err) {
  write_str(2, "dstrain launch: ");
  write_str(2, what);
  write_str(2, detail);
  write_str(2, ": ");
  // strerror is not async-signal-safe in general; the launcher is single-threaded, so no lock can
  // be held by another thread at fork time.
  write_str(2, std::strerror(err));
  write_str(2, "\n");
}

// Runs in the forked child: only async-signal-safe calls from here on.
[[noreturn]] void exec_child(pid_t launcher, const ChildFds& fds, char* const* argv,
                             char* const* envp) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);  // the launcher died before the prctl took effect
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP, SIGQUIT}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (const char* failed = place_descriptors(fds)) {
    report_child_failure("cannot set up the rank's descriptors 1-4: ", failed, errno);
    ::_exit(127);
  }
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd == 0) ::fcntl(0, F_SETFD, 0);  // dup2 onto itself would keep close-on-exec
  if (null_fd > 0) ::dup2(null_fd, 0);
  ::execve(argv[0], argv, envp);
  report_child_failure("cannot execute ", argv[0], errno);
  ::_exit(127);
}

}  // namespace

LocalProcess spawn_local(const RankSpec& rank) {
  std::vector<std::string> argv_strings = rank.argv;
  EnvList env = rank.env;
  env.emplace_back(liveness::kLivenessFdVar, std::to_string(liveness::kLivenessFd));
  env.emplace_back(teardown::kTeardownFdVar, std::to_string(teardown::kTeardownFd));
  std::vector<std::string> env_strings = merged_environment(env);
  std::vector<char*> argv = c_array(argv_strings);
  std::vector<char*> envp = c_array(env_strings);
  int out[2];
  int err[2];
  int live[2];
  int reason[2];
  make_pipe(out, "output");
  make_pipe(err, "output");
  make_pipe(reason, "teardown reason");
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, live) != 0) {
    fail(ErrorKind::kIo, "cannot create a socket pair for a rank's heartbeat: {}",
         std::strerror(errno));
  }
  pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0)
    exec_child(launcher, ChildFds{{out[1], err[1], live[1], reason[0]}}, argv.data(), envp.data());
  int fork_errno = errno;
  for (int child_end : {out[1], err[1], live[1], reason[0]}) ::close(child_end);
  if (pid < 0) {
    for (int own_end : {out[0], err[0], live[0], reason[1]}) ::close(own_end);
    fail(ErrorKind::kIo, "cannot start rank {}: fork failed: {}", rank.rank,
         std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also from the parent, so the group exists before we ever signal it
  for (int own_end : {out[0], err[0], live[0], reason[1]}) ::fcntl(own_end, F_SETFL, O_NONBLOCK);
  return LocalProcess{pid, out[0], err[0], live[0], reason[1]};
}

}  // namespace dstrain::launcher
