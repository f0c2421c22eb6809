#include "launcher/signals.h"

#include <fcntl.h>
#include <unistd.h>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

constexpr int kCaught[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGCHLD};
int g_write_fd = -1;
struct sigaction g_saved[sizeof(kCaught) / sizeof(kCaught[0])];
struct sigaction g_saved_pipe;

void on_signal(int sig) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_write_fd, &byte, 1);  // a full pipe drops the byte; one is enough
  (void)ignored;
  errno = saved_errno;
}

}  // namespace

SignalPipe::SignalPipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    fail(ErrorKind::kIo, "cannot create the launcher's signal pipe: {}", std::strerror(errno));
  }
  read_fd_ = fds[0];
  g_write_fd = fds[1];
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (size_t i = 0; i < sizeof(kCaught) / sizeof(kCaught[0]); ++i) {
    ::sigaction(kCaught[i], &action, &g_saved[i]);
  }
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &g_saved_pipe);
}

SignalPipe::~SignalPipe() {
  for (size_t i = 0; i < sizeof(kCaught) / sizeof(kCaught[0]); ++i) {
    ::sigaction(kCaught[i], &g_saved[i], nullptr);
  }
  ::sigaction(SIGPIPE, &g_saved_pipe, nullptr);
  ::close(g_write_fd);
  ::close(read_fd_);
  g_write_fd = -1;
}

std::vector<ReceivedSignal> SignalPipe::drain() {
  std::vector<ReceivedSignal> out;
  unsigned char buf[64];
  ssize_t n;
  while ((n = ::read(read_fd_, buf, sizeof(buf))) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      out.push_back({buf[i]});
    }
  }
  return out;
}

}  // namespace dstrain::launcher
