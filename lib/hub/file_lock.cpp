#include "hub/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/fs.h"

namespace dstrain::hub {
namespace {

// One attempt: the descriptor of the locked file, or -1 when another process holds it.
int try_lock_once(const std::filesystem::path& file) {
  // Group-writable, as huggingface_hub creates its lock files: users sharing a cache can wait.
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0664);
  if (fd < 0)
    fail(ErrorKind::kIo, "cannot open the lock file {}: {}", file.string(), std::strerror(errno));
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) return -1;
    fail(ErrorKind::kIo,
         "cannot lock {}: {} (the file system of the hub cache must support flock; set "
         "HF_HUB_CACHE to another place)",
         file.string(), std::strerror(err));
  }
  // Locked, but maybe a file another process has unlinked meanwhile: then the name is free for
  // someone else to lock a new file, and this lock guards nothing.
  struct stat held {
  }, named{};
  if (::fstat(fd, &held) == 0 && ::stat(file.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
      held.st_dev == named.st_dev)
    return fd;
  ::close(fd);
  return -1;
}

}  // namespace

FileLock FileLock::acquire(const std::filesystem::path& file,
                           const std::function<void(double)>& on_wait, double report_every_s) {
  fs::create_dirs(file.parent_path());
  const auto start = std::chrono::steady_clock::now();
  double next_report = report_every_s;
  while (true) {
    const int fd = try_lock_once(file);
    if (fd >= 0) return FileLock(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (on_wait && waited >= next_report) {
      on_wait(waited);
      next_report += report_every_s;
    }
  }
}

std::optional<FileLock> FileLock::try_acquire(const std::filesystem::path& file) {
  fs::create_dirs(file.parent_path());
  const int fd = try_lock_once(file);
  if (fd < 0) return std::nullopt;
  return FileLock(fd);
}

FileLock::FileLock(FileLock&& other) noexcept : fd_(other.fd_) {
  other.fd_ = -1;
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

}  // namespace dstrain::hub
