// `dstrain ckpt verify` and `dstrain ckpt inspect` as a user runs them on a real checkpoint:
// exit 0 when intact, 1 naming the damaged file, 2 for a path that is no checkpoint.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {
namespace stdfs = std::filesystem;

TEST(CkptCli, VerifyAndInspectARealCheckpoint) {
  TempDir tmp;
  JobSpec spec;
  spec.nproc = 2;
  spec.stage = 2;
  spec.max_steps = 3;
  spec.save_final = true;
  const std::string config = write_job_config(tmp.path(), spec);
  const RunResult run = launch_job(config, 2);
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  const std::string latest = tmp.path() + "/ckpt/latest";

  RunResult r = run_dstrain({"ckpt", "verify", latest}, {}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("every size and checksum verified"), std::string::npos) << r.out;

  r = run_dstrain({"ckpt", "inspect", latest, "--config", config, "--set", "training.lr=0.5"}, {},
                  60);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("step 3  world size 2  zero stage 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("training.lr: "), std::string::npos) << r.out;

  const stdfs::path shard =
      stdfs::path(tmp.path()) / "ckpt" / "step_00000003" / "shard_r00001.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  r = run_dstrain({"ckpt", "verify", latest}, {}, 60);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("shard_r00001.safetensors: crc32 "), std::string::npos) << r.out;

  r = run_dstrain({"ckpt", "verify", tmp.path() + "/nothing"}, {}, 60);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("nothing"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dstrain::testing
