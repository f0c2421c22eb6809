#include "metrics/termination.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "core/error.h"
#include "core/teardown_signal.h"

namespace dstrain::metrics {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
constexpr unsigned char kQuit = 0;  // not a signal number: the destructor's wake-up

std::atomic<int> g_write_fd{-1};
struct sigaction g_previous[2];

void on_signal(int signo, siginfo_t* info, void*) {
  const int saved = errno;
  const int fd = g_write_fd.load();
  if (fd >= 0) {
    const unsigned char byte = signal_byte(signo, info);
    [[maybe_unused]] const ssize_t n = ::write(fd, &byte, 1);
  }
  errno = saved;
}

}  // namespace

TerminationWatch::TerminationWatch(std::function<void(int, bool)> on_signal_fn)
    : on_signal_(std::move(on_signal_fn)) {
  if (::pipe2(pipe_, O_CLOEXEC) != 0) fail(ErrorKind::kIo, "cannot create a pipe for signals");
  g_write_fd.store(pipe_[1]);
  thread_ = std::thread([this] { watch(); });
  struct sigaction sa {};
  sa.sa_sigaction = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
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

void TerminationWatch::watch() {
  unsigned char byte = 0;
  while (true) {
    const ssize_t n = ::read(pipe_[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1 || byte == kQuit) return;
    const int signo = signal_of_byte(byte);
    on_signal_(signo, peer_failed_of_byte(byte));
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(signo, &dfl, nullptr);
    // raise() targets this thread; the default action of SIGTERM/SIGINT ends the whole process.
    ::raise(signo);
    return;
  }
}

}  // namespace dstrain::metrics
