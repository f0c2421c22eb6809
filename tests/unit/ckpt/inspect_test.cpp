// `dstrain ckpt verify/inspect`: every listed file checked for size and crc32, problems named per
// file, unlisted files reported, and the saved config compared with a given one.
#include "ckpt/inspect.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "ckpt/layout.h"
#include "ckpt/shards.h"
#include "core/error.h"

namespace dstrain::ckpt {
namespace {
namespace stdfs = std::filesystem;
using nlohmann::json;

const char* kConfig =
    "model:\n  name_or_path: m\ndata:\n  train_path: t.txt\ntraining:\n  lr: 1.0e-3\n";

class InspectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = stdfs::temp_directory_path() / ("dstrain_ckpt_inspect_" + std::to_string(::getpid()));
    stdfs::remove_all(dir_);
    stdfs::create_directories(dir_);
    const std::string tag = tag_for_step(5);
    tag_dir_ = dir_ / tag;
    stdfs::create_directories(tag_dir_);
    for (int r = 0; r < 2; ++r) {
      write_shard(tag_dir_.string(), r, {{"master", "w", {8}, r * 4, r * 4 + 4, torch::ones({4})}},
                  {}, json::object());
    }
    std::ofstream(tag_dir_ / kRunConfigFile) << kConfig;
    Manifest m;
    m.tag = tag;
    m.step = 5;
    m.world_size = 2;
    m.zero_stage = 2;
    m.config_yaml = kConfig;
    finalize(dir_.string(), m, 0);
  }
  void TearDown() override { stdfs::remove_all(dir_); }
  stdfs::path dir_;
  stdfs::path tag_dir_;
};

TEST_F(InspectTest, IntactCheckpointVerifiesThroughLatest) {
  const VerifyReport r = verify_checkpoint((dir_ / kLatestFile).string());
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.files.size(), 5u);  // 2 shards, 2 rank JSONs, config.yaml
  EXPECT_TRUE(r.unlisted.empty());
  const std::string text = inspect_report(dir_.string(), "", {});
  EXPECT_NE(text.find("step 5  world size 2  zero stage 2"), std::string::npos) << text;
  EXPECT_NE(text.find("every checksum verified"), std::string::npos) << text;
}

TEST_F(InspectTest, EachDamagedFileIsNamedWithItsProblem) {
  std::ofstream(tag_dir_ / kRunConfigFile, std::ios::app) << "# edited\n";
  {
    std::fstream f(tag_dir_ / shard_file_name(0), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x01');
  }
  stdfs::remove(tag_dir_ / shard_state_file_name(1));
  std::ofstream(tag_dir_ / "stray.txt") << "x";
  const VerifyReport r = verify_checkpoint(tag_dir_.string());
  EXPECT_FALSE(r.ok());
  std::map<std::string, std::string> problems;
  for (const FileCheck& f : r.files) problems[f.name] = f.problem();
  EXPECT_EQ(problems[shard_file_name(0)].rfind("crc32 ", 0), 0u) << problems[shard_file_name(0)];
  EXPECT_EQ(problems[shard_state_file_name(1)], "missing");
  EXPECT_EQ(problems[kRunConfigFile].rfind("size ", 0), 0u) << problems[kRunConfigFile];
  EXPECT_EQ(problems[shard_file_name(1)], "");
  EXPECT_EQ(r.unlisted, std::vector<std::string>{"stray.txt"});
  EXPECT_NE(inspect_report(tag_dir_.string(), "", {}).find("3 file(s) FAILED"), std::string::npos);
}

TEST_F(InspectTest, ConfigDifferencesNameKeyAndBothValues) {
  const stdfs::path given = dir_ / "given.yaml";
  std::ofstream(given) << kConfig;
  const Manifest m = read_manifest(tag_dir_.string());
  EXPECT_TRUE(config_differences(m, given.string(), {}).empty());
  const auto diffs = config_differences(m, given.string(), {"training.lr=2e-3"});
  ASSERT_EQ(diffs.size(), 1u);
  EXPECT_EQ(diffs[0].key, "training.lr");
  EXPECT_NE(diffs[0].checkpoint, diffs[0].given);
  EXPECT_NE(
      inspect_report(tag_dir_.string(), given.string(), {"training.lr=2e-3"}).find("training.lr: "),
      std::string::npos);
}

TEST_F(InspectTest, NotACheckpointIsAnInputError) {
  try {
    verify_checkpoint((dir_ / "nope").string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInput);
  }
}

}  // namespace
}  // namespace dstrain::ckpt
