// Resolution without a network: local directories, snapshots already in the cache (whichever
// tool put them there), and the offline errors. Downloading is tested end to end against a local
// Hub in tests/reference/test_hub.py.

#include "hub/resolve.h"

#include <gtest/gtest.h>

#include "hub_test_util.h"

namespace dstrain::hub {
namespace {

namespace stdfs = std::filesystem;
using testing::TempDir;

const std::string kA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const std::string kB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

HubSettings offline_settings(const stdfs::path& cache) {
  HubSettings s;
  s.cache_dir = cache;
  s.endpoint = "http://127.0.0.1:9";  // never contacted: offline
  s.offline = true;
  return s;
}

void write_model(const stdfs::path& dir) {
  testing::write(dir / "config.json");
  testing::write(dir / "model.safetensors");
}

stdfs::path resolve(const ModelSource& source, const HubSettings& s) {
  return resolve_model_dir(source, {}, s);
}

TEST(Resolve, LocalDirectoryWithConfigIsReturned) {
  TempDir dir;
  testing::write(dir / "config.json");
  EXPECT_EQ(resolve({dir.path().string()}, offline_settings(dir / "cache")), dir.path());
}

TEST(Resolve, LocalDirectoryWithoutConfigIsInputError) {
  TempDir dir;
  testing::expect_error([&] { resolve({dir.path().string()}, offline_settings(dir / "c")); },
                        ErrorKind::kInput, {dir.path().string(), "config.json"});
}

TEST(Resolve, NameThatIsNeitherDirectoryNorHubIdIsInputError) {
  TempDir cache;
  testing::expect_error([&] { resolve({"/no/such/model/dir"}, offline_settings(cache.path())); },
                        ErrorKind::kInput, {"/no/such/model/dir", "no such directory"});
  testing::expect_error([&] { resolve({"a/b/c"}, offline_settings(cache.path())); },
                        ErrorKind::kInput, {"a/b/c"});
}

TEST(Resolve, CachedRevisionFollowsItsRef) {
  TempDir cache;
  const RepoLayout l(cache.path(), "Org/Tiny");
  write_model(l.snapshot(kA));
  write_model(l.snapshot(kB));
  l.write_ref("main", kA);
  l.write_ref("v1", kB);
  EXPECT_EQ(resolve({"Org/Tiny"}, offline_settings(cache.path())), l.snapshot(kA));
  EXPECT_EQ(resolve({"Org/Tiny", "v1"}, offline_settings(cache.path())), l.snapshot(kB));
  EXPECT_EQ(resolve({"Org/Tiny", kB}, offline_settings(cache.path())), l.snapshot(kB));
}

TEST(Resolve, WithoutRefsMainTheNewestSnapshotWithConfigIsUsed) {
  TempDir cache;
  const RepoLayout l(cache.path(), "gpt-like");
  stdfs::create_directories(l.dir() / "snapshots" / "empty");
  write_model(l.dir() / "snapshots" / "full");
  EXPECT_EQ(resolve({"gpt-like"}, offline_settings(cache.path())), l.dir() / "snapshots" / "full");
}

TEST(Resolve, SnapshotWithoutWeightsServesOnlyWhenWeightsAreNotWanted) {
  TempDir cache;
  const RepoLayout l(cache.path(), "Org/Tiny");
  testing::write(l.snapshot(kA) / "config.json");
  l.write_ref("main", kA);
  EXPECT_EQ(resolve({"Org/Tiny", "main", false}, offline_settings(cache.path())), l.snapshot(kA));
  testing::expect_error([&] { resolve({"Org/Tiny"}, offline_settings(cache.path())); },
                        ErrorKind::kInput, {"Org/Tiny", "HF_HUB_OFFLINE", "model.safetensors"});
}

TEST(Resolve, UncachedHubIdOfflineSaysWhereItLooked) {
  TempDir cache;
  testing::expect_error(
      [&] {
        resolve({"Org/Missing", "v2"}, offline_settings(cache.path()));
      },
      ErrorKind::kInput,
      {"Org/Missing", "v2", cache.path().string(), "HF_HUB_OFFLINE",
       "dstrain download Org/Missing"});
}

TEST(Resolve, UnreachableHubIsIoError) {
  TempDir cache;
  HubSettings s = offline_settings(cache.path());
  s.offline = false;
  s.endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
  s.max_retries = 0;  // the retries themselves are tested against a local Hub (test_hub.py)
  testing::expect_error([&] { resolve({"Org/Tiny"}, s); }, ErrorKind::kIo,
                        {"cannot reach the Hub", "127.0.0.1:1", "HF_HUB_OFFLINE"});
}

TEST(Resolve, DownloadCommandNeedsAHubId) {
  testing::expect_error([] { download_model("not/a/hub/id", "main"); }, ErrorKind::kUsage,
                        {"not/a/hub/id"});
}

}  // namespace
}  // namespace dstrain::hub
