#include "core/fs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "core/error.h"

namespace dstrain::fs {
namespace {

stdfs::path temp_dir() {
  auto d = stdfs::temp_directory_path() / ("dstrain_fs_test_" + std::to_string(::getpid()));
  stdfs::create_directories(d);
  return d;
}

TEST(Fs, AtomicWriteReplacesContentAndLeavesNoTemp) {
  auto d = temp_dir();
  write_file_atomic(d / "a" / "latest", "step-1");
  write_file_atomic(d / "a" / "latest", "step-2");
  EXPECT_EQ(read_file(d / "a" / "latest"), "step-2");
  int files = 0;
  for ([[maybe_unused]] auto& e : stdfs::directory_iterator(d / "a")) ++files;
  EXPECT_EQ(files, 1);
  stdfs::remove_all(d);
}

TEST(Fs, ReadMissingFileNamesPath) {
  try {
    read_file("/nonexistent/dstrain/file.txt");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dstrain/file.txt"), std::string::npos);
  }
}

}  // namespace
}  // namespace dstrain::fs
