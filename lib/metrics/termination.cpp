#include "metrics/termination.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>

#include "core/error.h"
#include "core/teardown_signal.h"

namespace dstrain::metrics {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT};
constexpr unsigned char kQuit = 0;  // not a signal number: the destructor's wake-up
// How long after the first signal further deliveries still count (see watch()).
constexpr int kSettleMs = 100;

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

// The next byte of the pipe, waiting at most timeout_ms (-1: no limit); false on timeout or error.
bool TerminationWatch::next_byte(int timeout_ms, unsigned char& byte) {
  pollfd p{pipe_[0], POLLIN, 0};
  while (true) {
    const int ready = ::poll(&p, 1, timeout_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready != 1) return false;
    const ssize_t n = ::read(pipe_[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    return n == 1;
  }
}

void TerminationWatch::watch() {
  unsigned char byte = 0;
  if (!next_byte(-1, byte) || byte == kQuit) return;
  const int signo = signal_of_byte(byte);
  bool peer_failed = peer_failed_of_byte(byte);
  // The launcher's "a rank failed" SIGTERM is followed at once by a plain one to the process
  // group. Usually the second finds the first pending and is dropped; but when two threads take
  // one each, their handlers may write in either order. So what arrives within kSettleMs counts.
  const auto settle_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kSettleMs);
  while (!peer_failed) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        settle_end - std::chrono::steady_clock::now());
    if (left.count() <= 0 || !next_byte(static_cast<int>(left.count()), byte)) break;
    if (byte == kQuit) return;
    peer_failed = peer_failed_of_byte(byte);
  }
  on_signal_(signo, peer_failed);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(signo, &dfl, nullptr);
  // raise() targets this thread; the default action of SIGTERM/SIGINT ends the whole process.
  ::raise(signo);
}

}  // namespace dstrain::metrics
