// A checkpoint directory that fills up (a small tmpfs in a mount namespace of this test): the
// save that does not fit fails with the OS's reason, the previous checkpoint stays `latest` and
// verifies, no temporary file is left under the tag directories, and the run stops
// (checkpoint.on_error: stop, the default) or trains on with a warning (continue).
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {
namespace stdfs = std::filesystem;

// Bytes of the files under `dir`.
uintmax_t tree_bytes(const std::string& dir) {
  uintmax_t n = 0;
  for (const auto& e : stdfs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

bool has_temporary_files(const std::string& dir) {
  for (const auto& e : stdfs::recursive_directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp") != std::string::npos) return true;
  }
  return false;
}

// A private mount namespace for this test process, so its tmpfs is invisible elsewhere.
bool private_mounts() {
  return ::unshare(CLONE_NEWNS) == 0 &&
         ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
}

TEST(CheckpointErrors, DiskFullKeepsThePreviousCheckpointAndStopsOrContinues) {
  if (!private_mounts()) GTEST_SKIP() << "needs root: a mount namespace for a small tmpfs";
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 2;
  spec.max_steps = 12;
  spec.checkpoint_interval = 4;
  const std::string cfg = write_job_config(dir.path(), spec);
  // One checkpoint's size, measured: the tmpfs holds one and a half.
  RunResult r = launch_job(cfg, 2, {"training.max_steps=4"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const uintmax_t one = tree_bytes(dir.file("ckpt/step_00000004"));
  ASSERT_GT(one, 1000000u);
  stdfs::remove_all(dir.file("ckpt"));

  for (const std::string mode : {"stop", "continue"}) {
    SCOPED_TRACE(mode);
    stdfs::create_directories(dir.file("ckpt"));
    const std::string size = "size=" + std::to_string(one * 3 / 2);
    ASSERT_EQ(::mount("tmpfs", dir.file("ckpt").c_str(), "tmpfs", 0, size.c_str()), 0);
    r = launch_job(cfg, 2, {"checkpoint.on_error=" + mode});
    const std::string all = r.out + r.err;
    EXPECT_NE(all.find("checkpoint at step 8 failed"), std::string::npos) << all;
    EXPECT_NE(all.find("No space left on device"), std::string::npos) << all;
    if (mode == "stop") {
      EXPECT_NE(r.exit_code, 0);
      EXPECT_NE(all.find("checkpoint.on_error: stop"), std::string::npos) << all;
    } else {
      EXPECT_EQ(r.exit_code, 0) << all;
      EXPECT_EQ(read_metric(dir.file("run/metrics.jsonl"), "train/loss").size(), 12u);
    }
    EXPECT_EQ(read_text(dir.file("ckpt/latest")), "step_00000004\n");
    EXPECT_FALSE(file_exists(dir.file("ckpt/step_00000008/manifest.json")));
    EXPECT_FALSE(has_temporary_files(dir.file("ckpt")));
    const RunResult v = run_dstrain({"ckpt", "verify", dir.file("ckpt/latest")}, {}, 60);
    EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
    ASSERT_EQ(::umount(dir.file("ckpt").c_str()), 0);
    stdfs::remove_all(dir.file("ckpt"));
    stdfs::remove_all(dir.file("run"));
  }
}

}  // namespace
}  // namespace dstrain::testing
