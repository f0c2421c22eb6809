#include "metrics/termination.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "core/error.h"

namespace dstrain::metrics {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
constexpr unsigned char kQuit = 0;  // not a signal number: the destructor's wake-up

std::atomic<int> g_write_fd{-1};
struct sigaction g_previous[2];

void on_signal(int signo) {
  const int saved = errno;
  const int fd = g_write_fd.load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(signo);
    [[maybe_unused]] const ssize_t n = ::write(fd, &byte, 1);
  }
  errno = saved;
}

}  // namespace

TerminationWatch::TerminationWatch(OnSignal on_signal_fn, int reason_fd)
    : on_signal_(std::move(on_signal_fn)), reason_fd_(reason_fd) {
  if (::pipe2(pipe_, O_CLOEXEC) != 0) fail(ErrorKind::kIo, "cannot create a pipe for signals");
  g_write_fd.store(pipe_[1]);
  thread_ = std::thread([this] { watch(); });
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < 2; ++i) sigaction(kSignals[i], &sa, &g_previous[i]);
}

TerminationWatch::~TerminationWatch() {
  for (int i = 0; i < 2; ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
  g_write_fd.store(-1);
  const unsigned char quit = kQuit;
  [[maybe_unused]] const ssize_t n = ::write(pipe_[1], &quit, 1);
  thread_.join();
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

// The next byte of the pipe, waiting as long as it takes; false on error.
bool TerminationWatch::next_byte(unsigned char& byte) {
  while (true) {
    const ssize_t n = ::read(pipe_[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    return n == 1;
  }
}

void TerminationWatch::watch() {
  unsigned char byte = 0;
  if (!next_byte(byte) || byte == kQuit) return;
  const int signo = byte;
  // The launcher wrote its reason, if any, before it sent its first signal (teardown_reason.h).
  on_signal_(signo, teardown::receive(reason_fd_));
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(signo, &dfl, nullptr);
  // raise() targets this thread; the default action of SIGTERM/SIGINT ends the whole process.
  ::raise(signo);
}

}  // namespace dstrain::metrics
