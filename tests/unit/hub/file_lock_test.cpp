#include "hub/file_lock.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "hub_test_util.h"

namespace dstrain::hub {
namespace {

namespace stdfs = std::filesystem;
using testing::TempDir;

// flock locks belong to open file descriptions, so two FileLocks in one process exclude each
// other exactly as two processes do.
TEST(FileLock, SecondHolderIsRefusedUntilTheFirstReleases) {
  TempDir dir;
  const stdfs::path file = dir / ".locks/models--Org--M/x.lock";
  {
    FileLock held = FileLock::acquire(file);
    EXPECT_TRUE(stdfs::exists(file));
    EXPECT_FALSE(FileLock::try_acquire(file).has_value());
  }
  EXPECT_TRUE(FileLock::try_acquire(file).has_value());
}

TEST(FileLock, WaiterGetsTheLockWhenReleasedAndReportsWaiting) {
  TempDir dir;
  const stdfs::path file = dir / "x.lock";
  auto held = std::make_unique<FileLock>(FileLock::acquire(file));
  std::atomic<bool> got{false};
  std::atomic<int> reports{0};
  std::thread waiter([&] {
    FileLock lock = FileLock::acquire(
        file, [&](double) { ++reports; }, 0.2);
    got = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_FALSE(got.load());
  EXPECT_GE(reports.load(), 1);
  held.reset();
  waiter.join();
  EXPECT_TRUE(got.load());
}

TEST(FileLock, LockFileUnlinkedByAnotherProgramIsTakenAfresh) {
  TempDir dir;
  const stdfs::path file = dir / "x.lock";
  FileLock old = FileLock::acquire(file);
  stdfs::remove(file);  // as filelock may do when it releases
  // The name is free again: a new lock on it is granted although `old` still holds the unlinked
  // inode, and a third one is refused by that new lock.
  auto fresh = FileLock::try_acquire(file);
  ASSERT_TRUE(fresh.has_value());
  EXPECT_FALSE(FileLock::try_acquire(file).has_value());
}

}  // namespace
}  // namespace dstrain::hub
