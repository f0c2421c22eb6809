#include "core/liveness.h"

#include <sys/socket.h>
#include <unistd.h>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"

namespace dstrain::liveness {

struct Beat::State {
  int fd = -1;
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;

  void run() {
    const char byte = 1;
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      // MSG_DONTWAIT: a launcher that stopped reading must not block this thread; MSG_NOSIGNAL: a
      // launcher that is gone must not kill the rank with SIGPIPE.
      if (::send(fd, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
          errno != EINTR) {
        return;
      }
      wake.wait_for(lock, kLivenessBeat, [this] { return stop; });
    }
  }
};

Beat::Beat(int fd) : state_(std::make_unique<State>()) {
  state_->fd = fd;
  state_->thread = std::thread([s = state_.get()] { s->run(); });
}

Beat::~Beat() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  state_->thread.join();
}

std::unique_ptr<Beat> start_beat_from_env() {
  const char* text = std::getenv(kLivenessFdVar);
  if (text == nullptr || *text == '\0') return nullptr;
  char* end = nullptr;
  errno = 0;
  const long fd = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || fd < 0 || fd > 1 << 20) {
    fail(ErrorKind::kUsage, "environment variable {}='{}' is not a file descriptor number",
         kLivenessFdVar, text);
  }
  return std::make_unique<Beat>(static_cast<int>(fd));
}

}  // namespace dstrain::liveness
