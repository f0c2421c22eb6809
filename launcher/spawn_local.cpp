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

void make_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    fail(ErrorKind::kIo, "cannot create a pipe for a rank's output: {}", std::strerror(errno));
  }
}

void write_str(int fd, const char* s) {
  ssize_t ignored = ::write(fd, s, std::strlen(s));
  (void)ignored;
}

// Runs in the forked child: only async-signal-safe calls from here on.
[[noreturn]] void exec_child(pid_t launcher, int out_w, int err_w, int live_w, char* const* argv,
                             char* const* envp) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(127);  // the launcher died before the prctl took effect
  for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP, SIGQUIT}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int null_fd = ::open("/dev/null", O_RDONLY);
  if (null_fd >= 0) ::dup2(null_fd, 0);
  ::dup2(out_w, 1);
  ::dup2(err_w, 2);
  // After 0-2: if one of out_w/err_w was descriptor 3, its copy is already in place. dup2 onto
  // itself would keep close-on-exec, so that case clears the flag instead.
  if (live_w == liveness::kLivenessFd)
    ::fcntl(live_w, F_SETFD, 0);
  else
    ::dup2(live_w, liveness::kLivenessFd);
  ::execve(argv[0], argv, envp);
  int err = errno;
  write_str(2, "dstrain launch: cannot execute ");
  write_str(2, argv[0]);
  write_str(2, ": ");
  // strerror is not async-signal-safe in general; the launcher is single-threaded, so no lock can
  // be held by another thread at fork time.
  write_str(2, std::strerror(err));
  write_str(2, "\n");
  ::_exit(127);
}

}  // namespace

LocalProcess spawn_local(const RankSpec& rank) {
  std::vector<std::string> argv_strings = rank.argv;
  EnvList env = rank.env;
  env.emplace_back(liveness::kLivenessFdVar, std::to_string(liveness::kLivenessFd));
  std::vector<std::string> env_strings = merged_environment(env);
  std::vector<char*> argv = c_array(argv_strings);
  std::vector<char*> envp = c_array(env_strings);
  int out[2];
  int err[2];
  int live[2];
  make_pipe(out);
  make_pipe(err);
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, live) != 0) {
    fail(ErrorKind::kIo, "cannot create a socket pair for a rank's heartbeat: {}",
         std::strerror(errno));
  }
  pid_t launcher = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) exec_child(launcher, out[1], err[1], live[1], argv.data(), envp.data());
  int fork_errno = errno;
  ::close(out[1]);
  ::close(err[1]);
  ::close(live[1]);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    ::close(live[0]);
    fail(ErrorKind::kIo, "cannot start rank {}: fork failed: {}", rank.rank,
         std::strerror(fork_errno));
  }
  ::setpgid(pid, pid);  // also from the parent, so the group exists before we ever signal it
  ::fcntl(out[0], F_SETFL, O_NONBLOCK);
  ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  ::fcntl(live[0], F_SETFL, O_NONBLOCK);
  return LocalProcess{pid, out[0], err[0], live[0]};
}

}  // namespace dstrain::launcher
