#pragma once
// TerminationWatch: lets a run record how it ended when it is told to stop by a signal. While one
// lives, SIGTERM and SIGINT do not kill the process at once: the handler only wakes a watcher
// thread (async-signal-safe: one write to a pipe), which calls `on_signal(signo, peer_failed)`
// (`peer_failed`: the launcher sent it because another rank failed, core/teardown_signal.h; any
// delivery in the first 100 ms after the first counts, as the launcher's two SIGTERMs may be
// handled in either order) — on
// that thread, so it works even while the main thread is blocked in a collective — then restores
// the default action and raises the signal again, so the process still dies by it (exit status 128
// + signal, what the launcher and schedulers expect). `on_signal` must return in bounded time: the
// launcher sends SIGKILL after its grace period (5 s by default).
//
// One at a time per process. The destructor restores the previous handlers.

#include <functional>
#include <thread>

namespace dstrain::metrics {

class TerminationWatch {
 public:
  explicit TerminationWatch(std::function<void(int, bool)> on_signal);
  ~TerminationWatch();
  TerminationWatch(const TerminationWatch&) = delete;
  TerminationWatch& operator=(const TerminationWatch&) = delete;

 private:
  void watch();
  bool next_byte(int timeout_ms, unsigned char& byte);

  std::function<void(int, bool)> on_signal_;
  int pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace dstrain::metrics
