#include "model/hub.h"

#include <cstdlib>
#include <fstream>

#include <gtest/gtest.h>

#include "test_util.h"

namespace dstrain::model {
namespace {

namespace stdfs = std::filesystem;
using testing::expect_error;
using testing::TempDir;

void touch(const stdfs::path& p, const std::string& text = "{}") {
  stdfs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// Sets or unsets an environment variable for the test's lifetime.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    if (old != nullptr) old_ = old, had_ = true;
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_.c_str(), old_.c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

TEST(Hub, LocalDirectoryWithConfigIsReturned) {
  TempDir dir;
  touch(dir / "config.json");
  EXPECT_EQ(resolve_model_dir(dir.path().string()), dir.path());
}

TEST(Hub, LocalDirectoryWithoutConfigIsInputError) {
  TempDir dir;
  expect_error([&] { resolve_model_dir(dir.path().string()); }, ErrorKind::kInput,
               {dir.path().string(), "config.json"});
}

TEST(Hub, CachedHubIdPrefersRefsMain) {
  TempDir cache;
  ScopedEnv env("HF_HUB_CACHE", cache.path().c_str());
  const stdfs::path repo = cache / "models--Org--Tiny-Model";
  touch(repo / "snapshots" / "aaa111" / "config.json");
  touch(repo / "snapshots" / "bbb222" / "config.json");
  touch(repo / "refs" / "main", "aaa111\n");
  EXPECT_EQ(resolve_model_dir("Org/Tiny-Model"), repo / "snapshots" / "aaa111");
}

TEST(Hub, WithoutRefsTheSnapshotHoldingConfigIsUsed) {
  TempDir cache;
  ScopedEnv env("HF_HUB_CACHE", cache.path().c_str());
  const stdfs::path repo = cache / "models--gpt-like";
  stdfs::create_directories(repo / "snapshots" / "empty");
  touch(repo / "snapshots" / "full" / "config.json");
  EXPECT_EQ(resolve_model_dir("gpt-like"), repo / "snapshots" / "full");
}

TEST(Hub, HfHomeIsUsedWhenHubCacheUnset) {
  TempDir home;
  ScopedEnv unset("HF_HUB_CACHE", nullptr);
  ScopedEnv env("HF_HOME", home.path().c_str());
  EXPECT_EQ(hf_hub_cache_dir(), home / "hub");
  touch(home / "hub" / "models--Qwen--Qwen2.5-0.5B" / "snapshots" / "c0ffee" / "config.json");
  touch(home / "hub" / "models--Qwen--Qwen2.5-0.5B" / "refs" / "main", "c0ffee");
  EXPECT_EQ(resolve_model_dir("Qwen/Qwen2.5-0.5B"),
            home / "hub" / "models--Qwen--Qwen2.5-0.5B" / "snapshots" / "c0ffee");
}

TEST(Hub, HomeCacheIsTheLastFallback) {
  ScopedEnv unset1("HF_HUB_CACHE", nullptr);
  ScopedEnv unset2("HF_HOME", nullptr);
  ScopedEnv home("HOME", "/home/someone");
  EXPECT_EQ(hf_hub_cache_dir(), stdfs::path("/home/someone/.cache/huggingface/hub"));
}

TEST(Hub, UncachedHubIdSaysWhereItLooked) {
  TempDir cache;
  ScopedEnv env("HF_HUB_CACHE", cache.path().c_str());
  expect_error(
      [&] { resolve_model_dir("Org/Missing"); }, ErrorKind::kInput,
      {"Org/Missing", (cache / "models--Org--Missing" / "snapshots").string(), "HF_HUB_CACHE"});
}

TEST(Hub, PathThatIsNotAHubIdIsInputError) {
  expect_error([&] { resolve_model_dir("/no/such/model/dir"); }, ErrorKind::kInput,
               {"/no/such/model/dir", "no such directory"});
  expect_error([&] { resolve_model_dir("a/b/c"); }, ErrorKind::kInput, {"a/b/c"});
}

}  // namespace
}  // namespace dstrain::model
