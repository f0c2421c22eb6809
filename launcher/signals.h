#pragma once
// Turns asynchronous signals into readable bytes (the self-pipe trick), so the supervisor's single
// poll() loop handles rank output, rank exits and Ctrl-C in one place without races.
// While a SignalPipe lives: SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGCHLD are caught (each delivery
// writes its number as one byte to the pipe) and SIGPIPE is ignored (a closed console must not kill
// the launcher and orphan the job). The destructor restores the previous dispositions. One instance
// at a time.

#include <vector>

namespace dstrain::launcher {

struct ReceivedSignal {
  int number = 0;
};

class SignalPipe {
 public:
  SignalPipe();  // Error(kIo) if the pipe cannot be created
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_fd_; }   // becomes readable when a signal arrived
  std::vector<ReceivedSignal> drain();  // the signals received since the last drain, in order

 private:
  int read_fd_ = -1;
};

}  // namespace dstrain::launcher
