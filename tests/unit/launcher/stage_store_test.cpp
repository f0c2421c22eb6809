#include "launcher/stage_store.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/common/temp_dir.h"

namespace dstrain::launcher {
namespace {

namespace stdfs = std::filesystem;
using testing::TempDir;

constexpr const char* kHelloSha256 =
    "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

void write(const stdfs::path& p, const std::string& text) {
  stdfs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

std::string read(const stdfs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ino_t inode(const stdfs::path& p) {
  struct stat st {};
  ::stat(p.c_str(), &st);
  return st.st_ino;
}

size_t entries(const stdfs::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : stdfs::directory_iterator(dir)) ++n;
  return n;
}

TEST(StageStore, FirstPutCopiesUnderTheSha256SecondReusesWithoutReading) {
  TempDir tmp;
  write(tmp / "shared/config.json", "hello");
  StageStore store(tmp / "stage");
  auto lock = store.lock();
  StagedFile first = store.put(tmp / "shared/config.json");
  EXPECT_EQ(first.sha256, kHelloSha256);
  EXPECT_TRUE(first.copied);
  EXPECT_TRUE(first.hashed);
  EXPECT_EQ(first.bytes, 5);
  EXPECT_EQ(read(store.blob(kHelloSha256)), "hello");
  EXPECT_EQ(stdfs::status(store.blob(kHelloSha256)).permissions() & stdfs::perms::all,
            stdfs::perms::owner_read | stdfs::perms::group_read | stdfs::perms::others_read);

  StagedFile second = store.put(tmp / "shared/config.json");
  EXPECT_EQ(second.sha256, kHelloSha256);
  EXPECT_FALSE(second.copied);
  EXPECT_FALSE(second.hashed) << "the record should have spared reading the source again";
  EXPECT_EQ(entries(tmp / "stage/tmp"), 0u);
}

TEST(StageStore, SameBytesAtAnotherPathAreReusedNotCopied) {
  TempDir tmp;
  write(tmp / "a/f", "hello");
  write(tmp / "b/f", "hello");
  StageStore store(tmp / "stage");
  auto lock = store.lock();
  EXPECT_TRUE(store.put(tmp / "a/f").copied);
  StagedFile other = store.put(tmp / "b/f");
  EXPECT_TRUE(other.hashed);
  EXPECT_FALSE(other.copied);
  EXPECT_EQ(entries(tmp / "stage/blobs/sha256"), 1u);
  EXPECT_EQ(entries(tmp / "stage/tmp"), 0u) << "the redundant copy must not stay behind";
}

TEST(StageStore, ChangedSourceIsReadAgainAndGetsANewBlob) {
  TempDir tmp;
  write(tmp / "f", "hello");
  StageStore store(tmp / "stage");
  auto lock = store.lock();
  const std::string before = store.put(tmp / "f").sha256;
  write(tmp / "f", "jello");  // same size; the mtime/ctime change
  stdfs::last_write_time(tmp / "f", stdfs::last_write_time(tmp / "f") + std::chrono::seconds(5));
  StagedFile after = store.put(tmp / "f");
  EXPECT_NE(after.sha256, before);
  EXPECT_TRUE(after.copied);
  EXPECT_EQ(read(store.blob(after.sha256)), "jello");
}

TEST(StageStore, BlobOfTheWrongSizeIsCopiedAgain) {
  TempDir tmp;
  write(tmp / "f", "hello");
  StageStore store(tmp / "stage");
  auto lock = store.lock();
  store.put(tmp / "f");
  stdfs::permissions(store.blob(kHelloSha256), stdfs::perms::owner_write, stdfs::perm_options::add);
  write(store.blob(kHelloSha256), "he");  // damaged by hand
  StagedFile again = store.put(tmp / "f");
  EXPECT_TRUE(again.copied);
  EXPECT_EQ(read(store.blob(kHelloSha256)), "hello");
}

TEST(StageStore, LeftoversOfAnInterruptedStagerAreIgnoredAndCleared) {
  TempDir tmp;
  write(tmp / "f", "hello");
  {
    StageStore store(tmp / "stage");  // makes the folders
  }
  write(tmp / "stage/tmp/blob.99999.0", "hel");  // a half copy under its temporary name
  stdfs::create_directories(tmp / "stage/tmp/view.99999.1");
  write(tmp / "stage/sources/garbage.json", "{not json");
  StageStore store(tmp / "stage");
  auto lock = store.lock();
  EXPECT_EQ(entries(tmp / "stage/tmp"), 0u);
  StagedFile f = store.put(tmp / "f");
  EXPECT_TRUE(f.copied);
  EXPECT_EQ(read(store.blob(kHelloSha256)), "hello");
  EXPECT_EQ(entries(tmp / "stage/blobs/sha256"), 1u);
}

TEST(StageStore, ViewIsHardLinksToBlobsNamedByContentAndReused) {
  TempDir tmp;
  write(tmp / "m/config.json", "hello");
  write(tmp / "m/model.safetensors", "weights");
  StageStore store(tmp / "stage");
  auto lock = store.lock();
  std::vector<ViewFile> files;
  for (const char* name : {"config.json", "model.safetensors"})
    files.push_back({name, store.put(tmp / "m" / name).sha256});
  const stdfs::path view = store.view("models", files);
  EXPECT_EQ(view.parent_path(), tmp.path() / "stage/models");
  EXPECT_EQ(read(view / "config.json"), "hello");
  EXPECT_EQ(read(view / "model.safetensors"), "weights");
  EXPECT_EQ(inode(view / "config.json"), inode(store.blob(kHelloSha256)));
  EXPECT_EQ(store.view("models", {files[1], files[0]}), view) << "order must not matter";
  EXPECT_NE(store.view("models", {files[0]}), view);
  stdfs::remove(view / "config.json");  // a view emptied by hand is made again
  EXPECT_EQ(store.view("models", files), view);
  EXPECT_EQ(read(view / "config.json"), "hello");
}

TEST(StageStore, ConcurrentStagersOnOneNodeTakeTurnsAndCopyOnce) {
  TempDir tmp;
  write(tmp / "big", std::string(4 << 20, 'x'));
  std::atomic<int> inside{0}, overlaps{0}, copies{0};
  auto stager = [&] {
    StageStore store(tmp / "stage");
    auto lock = store.lock();
    if (inside++ != 0) overlaps++;
    if (store.put(tmp / "big").copied) copies++;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    inside--;
  };
  // flock locks belong to open file descriptions: two threads exclude each other as processes do.
  std::thread a(stager), b(stager);
  a.join();
  b.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(copies.load(), 1);
}

TEST(StageStore, UnusableStageDirectoryIsAnInputErrorNamingThePath) {
  TempDir tmp;
  write(tmp / "file", "x");
  try {
    StageStore store(tmp / "file/stage");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find((tmp / "file/stage").string()), std::string::npos)
        << e.what();
  }
}

TEST(StageStore, MissingSourceIsAnInputErrorNamingIt) {
  TempDir tmp;
  StageStore store(tmp / "stage");
  auto lock = store.lock();
  try {
    store.put(tmp / "nope.json");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("nope.json"), std::string::npos) << e.what();
  }
}

// In a child process (a death test): put() under a 64 KiB file size limit. Exit code 3 for the
// stage's Error(kInput), 4 for another kind, 0 for no error.
void put_with_file_size_limit(const stdfs::path& root, const stdfs::path& source) {
  std::signal(SIGXFSZ, SIG_IGN);
  StageStore store(root);
  auto lock = store.lock();
  rlimit limit{64 << 10, 64 << 10};
  ::setrlimit(RLIMIT_FSIZE, &limit);
  try {
    store.put(source);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(e.kind() == ErrorKind::kInput ? 3 : 4);
  }
  std::_Exit(0);
}

// A full disk, short of mounting one: a file size limit makes write(2) fail the same way, midway.
TEST(StageStore, WriteFailureMidwayLeavesNoBlobAndNamesThePath) {
  TempDir tmp;
  write(tmp / "big", std::string(1 << 20, 'x'));
  const stdfs::path root = tmp / "stage";
  EXPECT_EXIT(put_with_file_size_limit(root, tmp / "big"), ::testing::ExitedWithCode(3),
              "stage: cannot write .*/stage/tmp/blob\\.");
  EXPECT_EQ(entries(root / "blobs/sha256"), 0u);
  StageStore store(root);
  auto lock = store.lock();
  EXPECT_EQ(entries(root / "tmp"), 0u);
  EXPECT_TRUE(store.put(tmp / "big").copied);
}

}  // namespace
}  // namespace dstrain::launcher
