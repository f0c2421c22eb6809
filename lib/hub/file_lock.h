#pragma once
// An exclusive flock(2) on a lock file: how processes that share a hub cache take turns. It is the
// lock huggingface_hub takes on the same files (its filelock uses flock too), so a Python download
// and a dstrain download of one blob exclude each other. Linux implements flock on NFS with the
// server's byte-range locks, so the exclusion holds across the hosts of a shared cache.
//
// The lock is released when the FileLock is destroyed or the process ends (the kernel drops it with
// the descriptor); the file itself is left in place. A lock file that another program unlinks while
// we wait is noticed (the inode of the name no longer matches the one locked) and taken again.

#include <filesystem>
#include <functional>
#include <optional>

namespace dstrain::hub {

class FileLock {
 public:
  // Blocks until the lock is held, creating the file (and its folders) when absent. While waiting,
  // `on_wait(seconds_waited)` is called about every `report_every_s` seconds. Error(kIo) when the
  // file cannot be created or the file system has no locks.
  static FileLock acquire(const std::filesystem::path& file,
                          const std::function<void(double)>& on_wait = {},
                          double report_every_s = 10.0);
  // The lock if it is free now, else nullopt.
  static std::optional<FileLock> try_acquire(const std::filesystem::path& file);

  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace dstrain::hub
