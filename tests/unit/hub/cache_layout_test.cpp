#include "hub/cache_layout.h"

#include <gtest/gtest.h>

#include "hub_test_util.h"

namespace dstrain::hub {
namespace {

namespace stdfs = std::filesystem;
using testing::TempDir;

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";

TEST(CacheLayout, HubIdsAndCommitHashes) {
  EXPECT_TRUE(is_hub_id("Qwen/Qwen2.5-0.5B"));
  EXPECT_TRUE(is_hub_id("gpt2"));
  EXPECT_FALSE(is_hub_id("a/b/c"));
  EXPECT_FALSE(is_hub_id("/abs/path"));
  EXPECT_FALSE(is_hub_id("Org/.hidden"));
  EXPECT_FALSE(is_hub_id("Org/../x"));
  EXPECT_TRUE(is_commit_hash(kCommit));
  EXPECT_FALSE(is_commit_hash("main"));
  EXPECT_FALSE(is_commit_hash("0123456789ABCDEF0123456789abcdef01234567"));
}

TEST(CacheLayout, NamesAreHuggingFaceHubs) {
  const RepoLayout l("/c", "Org/Name");
  EXPECT_EQ(repo_folder_name("Org/Name"), "models--Org--Name");
  EXPECT_EQ(repo_folder_name("gpt2"), "models--gpt2");
  EXPECT_EQ(l.blob("abc"), stdfs::path("/c/models--Org--Name/blobs/abc"));
  EXPECT_EQ(l.incomplete_blob("abc"), stdfs::path("/c/models--Org--Name/blobs/abc.incomplete"));
  EXPECT_EQ(l.pointer(kCommit, "sub/f.json"),
            stdfs::path("/c/models--Org--Name/snapshots/" + kCommit + "/sub/f.json"));
  EXPECT_EQ(l.ref("refs/pr/1"), stdfs::path("/c/models--Org--Name/refs/refs/pr/1"));
  EXPECT_EQ(l.blob_lock("abc"), stdfs::path("/c/.locks/models--Org--Name/abc.lock"));
}

TEST(CacheLayout, NamesThatWouldLeaveTheirFolderAreRefused) {
  const RepoLayout l("/c", "Org/Name");
  testing::expect_error([&] { l.pointer(kCommit, "../../../etc/passwd"); }, ErrorKind::kInput,
                        {"file name"});
  testing::expect_error([&] { l.pointer(kCommit, "/etc/passwd"); }, ErrorKind::kInput, {});
  testing::expect_error([&] { l.blob("../x"); }, ErrorKind::kInput, {"ETag"});
  testing::expect_error([&] { l.snapshot(".."); }, ErrorKind::kInput, {"commit"});
}

TEST(CacheLayout, RefIsTheBareCommitWrittenOnlyForBranchesAndTags) {
  TempDir cache;
  const RepoLayout l(cache.path(), "Org/Name");
  EXPECT_EQ(l.read_ref("main"), std::nullopt);
  l.write_ref("main", kCommit);
  EXPECT_EQ(testing::read(l.ref("main")), kCommit);  // no newline, as huggingface_hub writes it
  EXPECT_EQ(l.read_ref("main"), kCommit);
  l.write_ref(kCommit, kCommit);
  EXPECT_FALSE(stdfs::exists(l.ref(kCommit)));
}

TEST(CacheLayout, PointersAreRelativeSymlinksToBlobs) {
  TempDir cache;
  const RepoLayout l(cache.path(), "Org/Name");
  testing::write(l.blob("e1"), "one");
  testing::write(l.blob("e2"), "two");
  l.link_pointer(kCommit, "config.json", "e1");
  l.link_pointer(kCommit, "sub/dir/x.json", "e2");
  EXPECT_EQ(stdfs::read_symlink(l.pointer(kCommit, "config.json")), "../../blobs/e1");
  EXPECT_EQ(stdfs::read_symlink(l.pointer(kCommit, "sub/dir/x.json")), "../../../../blobs/e2");
  EXPECT_EQ(testing::read(l.pointer(kCommit, "sub/dir/x.json")), "two");
  l.link_pointer(kCommit, "config.json", "e2");  // replaced in place
  EXPECT_EQ(testing::read(l.pointer(kCommit, "config.json")), "two");
}

}  // namespace
}  // namespace dstrain::hub
