#include "ckpt/layout.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace dstrain::ckpt {
namespace {
namespace stdfs = std::filesystem;

class LayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = stdfs::temp_directory_path() / ("dstrain_ckpt_layout_" + std::to_string(::getpid()));
    stdfs::remove_all(dir_);
    stdfs::create_directories(dir_);
  }
  void TearDown() override { stdfs::remove_all(dir_); }
  void make_tag(int64_t step, bool complete) {
    const auto d = dir_ / tag_for_step(step);
    stdfs::create_directories(d);
    std::ofstream(d / shard_file_name(0)) << "x";
    if (complete) std::ofstream(d / kManifestFile) << "{}";
  }
  stdfs::path dir_;
};

TEST(Tag, RoundTripsStepAndRejectsOtherNames) {
  EXPECT_EQ(tag_for_step(100), "step_00000100");
  EXPECT_EQ(step_of_tag("step_00000100"), 100);
  EXPECT_FALSE(step_of_tag("latest").has_value());
  EXPECT_FALSE(step_of_tag("step_").has_value());
  EXPECT_FALSE(step_of_tag("step_12a").has_value());
  EXPECT_EQ(shard_file_name(3), "shard_r00003.safetensors");
}

TEST_F(LayoutTest, ResolvesLatestFileDirectoryAndTagDirectory) {
  make_tag(10, true);
  write_latest(dir_.string(), tag_for_step(10));
  const std::string want = (dir_ / "step_00000010").string();
  EXPECT_EQ(resolve_checkpoint((dir_ / "latest").string()), want);
  EXPECT_EQ(resolve_checkpoint(dir_.string()), want);
  EXPECT_EQ(resolve_checkpoint(want), want);
}

TEST_F(LayoutTest, IncompleteCheckpointIsAClearInputError) {
  make_tag(20, false);
  try {
    resolve_checkpoint((dir_ / "step_00000020").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
    EXPECT_NE(std::string(e.what()).find("manifest.json"), std::string::npos);
  }
  EXPECT_THROW(resolve_checkpoint((dir_ / "nope").string()), Error);
}

TEST_F(LayoutTest, PruneKeepsNewestAndProtectedAndDropsStaleIncomplete) {
  make_tag(10, true);
  make_tag(20, false);  // crashed save, older than the newest complete one
  make_tag(30, true);
  make_tag(40, true);
  make_tag(50, false);  // a save in progress: must survive
  prune(dir_.string(), 2, tag_for_step(10));
  EXPECT_TRUE(stdfs::exists(dir_ / "step_00000010"));  // protected
  EXPECT_FALSE(stdfs::exists(dir_ / "step_00000020"));
  EXPECT_TRUE(stdfs::exists(dir_ / "step_00000030"));
  EXPECT_TRUE(stdfs::exists(dir_ / "step_00000040"));
  EXPECT_TRUE(stdfs::exists(dir_ / "step_00000050"));
  prune(dir_.string(), 1, "");
  EXPECT_EQ(list_complete_tags(dir_.string()), std::vector<std::string>{"step_00000040"});
}

}  // namespace
}  // namespace dstrain::ckpt
