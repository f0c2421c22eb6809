#include "launcher/group_guard.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

constexpr pid_t kDisarm = 0;

// The guard's whole life. Returns only by _exit.
[[noreturn]] void guard_main(int read_fd) {
  ::setpgid(0, 0);
  for (int sig : {SIGINT, SIGHUP, SIGPIPE}) ::signal(sig, SIG_IGN);
  for (int sig : {SIGTERM, SIGCHLD}) ::signal(sig, SIG_DFL);
  int null_fd = ::open("/dev/null", O_RDWR);
  for (int fd = 0; fd <= 2 && null_fd >= 0; ++fd) ::dup2(null_fd, fd);  // never hold the console
  std::vector<pid_t> groups;
  pid_t pgid;
  for (;;) {
    ssize_t n = ::read(read_fd, &pgid, sizeof(pgid));
    if (n < 0 && errno == EINTR) continue;
    if (n == static_cast<ssize_t>(sizeof(pgid)) && pgid == kDisarm) ::_exit(0);
    if (n == static_cast<ssize_t>(sizeof(pgid))) {
      groups.push_back(pgid);
      continue;
    }
    break;  // end of file (or a broken pipe): the launcher is gone
  }
  for (pid_t group : groups) ::kill(-group, SIGKILL);
  ::_exit(0);
}

}  // namespace

GroupGuard::GroupGuard() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    fail(ErrorKind::kIo, "cannot create the launcher's guard pipe: {}", std::strerror(errno));
  }
  pid_ = ::fork();
  if (pid_ == 0) {
    ::close(fds[1]);
    guard_main(fds[0]);
  }
  int fork_errno = errno;
  ::close(fds[0]);
  if (pid_ < 0) {
    ::close(fds[1]);
    fail(ErrorKind::kIo, "cannot start the launcher's guard process: {}",
         std::strerror(fork_errno));
  }
  write_fd_ = fds[1];
}

GroupGuard::~GroupGuard() {
  disarm();
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

void GroupGuard::watch(pid_t pgid) {
  if (write_fd_ < 0 || pgid <= 0) return;
  ssize_t ignored = ::write(write_fd_, &pgid, sizeof(pgid));  // sizeof(pid_t) < PIPE_BUF: atomic
  (void)ignored;
}

void GroupGuard::disarm() {
  if (write_fd_ < 0) return;
  pid_t marker = kDisarm;
  ssize_t ignored = ::write(write_fd_, &marker, sizeof(marker));
  (void)ignored;
  ::close(write_fd_);
  write_fd_ = -1;
}

}  // namespace dstrain::launcher
