// `dstrain launch` end to end, the parts that do not involve failures: each rank's environment,
// output prefixing and log files, --dry-run, and flag errors. Ranks are `--exec -- sh -c '...'`
// scripts.

#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"

namespace dstrain::testing {
namespace {

std::map<std::string, std::string> parse_env(const std::string& text) {
  std::map<std::string, std::string> env;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

TEST(LaunchEnv, EveryRankGetsItsTorchrunVariables) {
  TempDir dir;
  RunResult r =
      run_dstrain({"launch", "--nproc", "3", "--master-addr", "10.20.30.40", "--master-port",
                   "29517", "--exec", "--", "sh", "-c", "env > \"$DSTRAIN_TEST_DIR/env_$RANK\""},
                  {"DSTRAIN_TEST_DIR=" + dir.path()});
  ASSERT_FALSE(r.timed_out);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    auto env = parse_env(read_text(dir.file("env_" + std::to_string(rank))));
    EXPECT_EQ(env["RANK"], std::to_string(rank));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["GROUP_RANK"], "0");
    EXPECT_EQ(env["NODE_RANK"], "0");
    EXPECT_EQ(env["MASTER_ADDR"], "10.20.30.40");
    EXPECT_EQ(env["MASTER_PORT"], "29517");
    EXPECT_EQ(env["DSTRAIN_TEST_DIR"], dir.path()) << "the launcher's environment is inherited";
  }
}

TEST(LaunchEnv, DefaultsToLoopbackAndOneFreePortForAllRanks) {
  TempDir dir;
  RunResult r =
      run_dstrain({"launch", "--nproc", "2", "--exec", "--", "sh", "-c",
                   "echo \"$MASTER_ADDR $MASTER_PORT\" > \"$DSTRAIN_TEST_DIR/master_$RANK\""},
                  {"DSTRAIN_TEST_DIR=" + dir.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string rank0 = read_text(dir.file("master_0"));
  EXPECT_EQ(rank0, read_text(dir.file("master_1")));
  ASSERT_TRUE(contains(rank0, "127.0.0.1 ")) << rank0;
  int port = std::stoi(rank0.substr(rank0.find(' ') + 1));
  EXPECT_GE(port, 1);
  EXPECT_LE(port, 65535);
}

TEST(LaunchOutput, PrefixesLinesPerStreamAndWritesRawLogFiles) {
  TempDir dir;
  std::string logs = dir.file("logs");
  RunResult r =
      run_dstrain({"launch", "--nproc", "2", "--log-dir", logs, "--exec", "--", "sh", "-c",
                   "echo \"out $RANK\"; echo \"err $RANK\" >&2; printf \"tail $RANK\""});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (std::string k : {"0", "1"}) {
    EXPECT_TRUE(contains(r.out, "[rank " + k + "] out " + k + "\n")) << r.out;
    EXPECT_TRUE(contains(r.out, "[rank " + k + "] tail " + k + "\n")) << r.out;
    EXPECT_TRUE(contains(r.err, "[rank " + k + "] err " + k + "\n")) << r.err;
    EXPECT_FALSE(contains(r.out, "err " + k)) << "stderr must not go to stdout";
    std::string log = read_text(logs + "/rank_" + k + ".log");
    EXPECT_TRUE(contains(log, "out " + k + "\n")) << log;
    EXPECT_TRUE(contains(log, "err " + k + "\n")) << log;
    EXPECT_TRUE(contains(log, "tail " + k)) << log;
    EXPECT_FALSE(contains(log, "[rank")) << "log files are not prefixed";
  }
  EXPECT_TRUE(contains(r.err, "all 2 rank(s) exited 0")) << r.err;
}

TEST(LaunchDryRun, ExecPrintsThePlanAndStartsNothing) {
  TempDir dir;
  std::string marker = dir.file("started");
  RunResult r = run_dstrain({"launch", "--nproc", "2", "--master-port", "29600", "--dry-run",
                             "--exec", "--", "sh", "-c", "touch " + marker});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "2 rank(s), master 127.0.0.1:29600")) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 1 on localhost (node 0, local rank 1)")) << r.out;
  EXPECT_TRUE(contains(r.out,
                       "RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 "
                       "NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29600"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "-c 'touch " + marker + "'")) << r.out;
  EXPECT_FALSE(file_exists(marker)) << "a dry run must not start ranks";
}

const char* kMinimalConfig =
    "model:\n  name_or_path: org/tiny-model\ndata:\n  train_path: train.txt\n"
    "training:\n  seed: 3\n";

TEST(LaunchDryRun, TrainPrintsTheTrainCommandLine) {
  TempDir dir;
  std::string config = dir.file("run.yaml");
  std::ofstream(config) << kMinimalConfig;
  RunResult r = run_dstrain({"launch", "--nproc", "2", "--dry-run", config, "--set",
                             "training.seed=7", "--", "--extra", "two words"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Ranks start the LibTorch worker beside dstrain directly (apps/dstrain/command_info.h).
  std::string binary = DSTRAIN_BINARY;
  std::string worker = binary.substr(0, binary.rfind('/') + 1) + "dstrain-worker";
  std::string expected = worker + " train " + config + " --set training.seed=7 --extra 'two words'";
  EXPECT_TRUE(contains(r.out, "  command: " + expected + "\n")) << r.out;
  EXPECT_TRUE(contains(r.out, "WORLD_SIZE=2")) << r.out;
}

// An invalid config is reported once, by the launcher, with exit code 2.
TEST(LaunchDryRun, InvalidConfigIsAnErrorBeforeAnythingStarts) {
  TempDir dir;
  std::string config = dir.file("bad.yaml");
  std::ofstream(config) << "training:\n  bogus_key_xyz: 1\n";
  RunResult r = run_dstrain({"launch", "--nproc", "2", "--dry-run", config});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "bogus_key_xyz")) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(LaunchDryRun, OverridesAndWorldSizeReachTheConfigCheck) {
  TempDir dir;
  std::string config = dir.file("run.yaml");
  std::ofstream(config) << kMinimalConfig;
  RunResult bad_key =
      run_dstrain({"launch", "--dry-run", config, "--set", "training.no_such_key_abc=1"});
  EXPECT_EQ(bad_key.exit_code, 2) << bad_key.err;
  EXPECT_TRUE(contains(bad_key.err, "no_such_key_abc")) << bad_key.err;
  // train_batch_size must equal micro batch (1) * accumulation (1) * world size (--nproc).
  RunResult fits = run_dstrain(
      {"launch", "--nproc", "2", "--dry-run", config, "--set", "training.train_batch_size=2"});
  EXPECT_EQ(fits.exit_code, 0) << fits.err;
  RunResult mismatch = run_dstrain(
      {"launch", "--nproc", "3", "--dry-run", config, "--set", "training.train_batch_size=2"});
  EXPECT_EQ(mismatch.exit_code, 2) << mismatch.err;
  EXPECT_TRUE(contains(mismatch.err, "train_batch_size")) << mismatch.err;
}

TEST(LaunchFlags, BadFlagsAndValuesExitWith2) {
  TempDir dir;
  const std::vector<std::vector<std::string>> cases = {
      {"launch", "--nproc", "0", "--exec", "--", "true"},
      {"launch", "--nproc", "x", "--exec", "--", "true"},
      {"launch", "--master-port", "70000", "--exec", "--", "true"},
      {"launch", "--master-port", "http", "--exec", "--", "true"},
      {"launch", "--grace", "-1", "--exec", "--", "true"},
      {"launch", "--nproc", "2", dir.file("missing.yaml")},
      {"launch", "--nproc", "2"},
      {"launch", "--exec"},
      {"launch", "--exec", "--", "no-such-program-for-dstrain-tests"},
      {"launch", "--no-such-flag", "--exec", "--", "true"},
  };
  for (const auto& args : cases) {
    RunResult r = run_dstrain(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << joined;
  }
}

TEST(LaunchFlags, HelpListsEveryFlag) {
  RunResult r = run_dstrain({"launch", "--help"});
  ASSERT_EQ(r.exit_code, 0);
  for (std::string flag : {"--nproc", "--set", "--master-addr", "--master-port", "--log-dir",
                           "--dry-run", "--grace", "--exec", "CONFIG"}) {
    EXPECT_TRUE(contains(r.out, flag)) << flag << "\n" << r.out;
  }
}

}  // namespace
}  // namespace dstrain::testing
