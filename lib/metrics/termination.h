#pragma once
// TerminationWatch: lets a run record how it ended when it is told to stop by a signal. While one
// lives, SIGTERM and SIGINT do not kill the process at once: the handler only wakes a watcher
// thread (async-signal-safe: one write to a pipe), which calls `on_signal(signo, failure)` — on
// that thread, so it works even while the main thread is blocked in a collective — then restores
// the default action and raises the signal again, so the process still dies by it (exit status 128
// + signal, what the launcher and schedulers expect). `on_signal` must return in bounded time: the
// launcher sends SIGKILL after its grace period (5 s by default).
//
// `failure` is what the launcher wrote on the rank's teardown pipe (`reason_fd`,
// core/teardown_reason.h) before it sent any signal: set when it stops the ranks because a rank
// failed, nullopt when the job was stopped (or there is no pipe: reason_fd < 0). It is read when
// the first signal is handled; which of the launcher's signals that is does not matter.
//
// One at a time per process. The destructor restores the previous handlers; it does not close
// `reason_fd`.

#include <functional>
#include <optional>
#include <thread>

#include "core/teardown_reason.h"

namespace dstrain::metrics {

class TerminationWatch {
 public:
  using OnSignal = std::function<void(int signo, const std::optional<teardown::RankFailure>&)>;
  TerminationWatch(OnSignal on_signal, int reason_fd);
  ~TerminationWatch();
  TerminationWatch(const TerminationWatch&) = delete;
  TerminationWatch& operator=(const TerminationWatch&) = delete;

 private:
  void watch();
  bool next_byte(unsigned char& byte);

  OnSignal on_signal_;
  int reason_fd_ = -1;
  int pipe_[2] = {-1, -1};
  std::thread thread_;
};

}  // namespace dstrain::metrics
