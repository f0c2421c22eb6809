#include "launcher/launch_record.h"

#include <unistd.h>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/common/expect_error.h"

namespace dstrain::launcher {
namespace {

namespace stdfs = std::filesystem;
using ::dstrain::testing::expect_error;

class LaunchRecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = stdfs::temp_directory_path().string() + "/dstrain_record_XXXXXX";
    dir_ = ::mkdtemp(pattern.data());
  }
  void TearDown() override { stdfs::remove_all(dir_); }

  std::string dir_;
};

// An SSH launch as `dstrain launch --hostfile hosts --exclude b --env ... --max-restarts 2 ...`.
LaunchOptions ssh_launch() {
  LaunchOptions o;
  o.hostfile = "hosts";
  o.selection.exclude = "b";
  o.env = {"GLOO_SOCKET_IFNAME=eth1", "HF_TOKEN=hf_abcdefgh12345", "MY_VAR=x=y"};
  o.secret_env = {"MY_VAR"};
  o.ssh.key_file = "keys/id";
  o.ssh.keepalive_seconds = 3;
  o.launch.master_port = 29600;
  o.launch.restart.max_restarts = 2;
  o.launch.restart.backoff_seconds = 0.5;
  o.launch.grace_seconds = 2;
  o.min_nodes = 1;
  o.allow_batch_change = true;
  return o;
}

TEST_F(LaunchRecordTest, AnSshLaunchIsRecordedWithAbsolutePathsAndReadBackTheSame) {
  const LaunchRecord r = record_of(ssh_launch(), LaunchMode::kSsh, 4, {"a", "c"});
  EXPECT_EQ(r.hostfile, (stdfs::current_path() / "hosts").string());
  EXPECT_EQ(r.ssh.key_file, (stdfs::current_path() / "keys/id").string());
  EXPECT_EQ(r.cwd, stdfs::current_path().string());
  write_launch_record(dir_ + "/ckpt", r);
  const auto back = read_launch_record(dir_ + "/ckpt");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->mode, LaunchMode::kSsh);
  EXPECT_EQ(back->world_size, 4);
  EXPECT_EQ(back->hosts, (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(back->hostfile, r.hostfile);
  EXPECT_EQ(back->selection.exclude, "b");
  EXPECT_EQ(back->selection.num_nodes, -1);
  EXPECT_EQ(back->ssh.key_file, r.ssh.key_file);
  EXPECT_EQ(back->ssh.keepalive_seconds, 3);
  EXPECT_EQ(back->master_addr, "");  // not given: each mode's default again
  EXPECT_EQ(back->master_port, 29600);
  EXPECT_EQ(back->restart.max_restarts, 2);
  EXPECT_EQ(back->restart.backoff_seconds, 0.5);
  EXPECT_EQ(back->grace_seconds, 2);
  EXPECT_EQ(back->min_nodes, 1);
  EXPECT_TRUE(back->allow_batch_change);
  EXPECT_EQ(back->secret_env, std::vector<std::string>{"MY_VAR"});
  EXPECT_EQ(back->cwd, r.cwd);
}

TEST_F(LaunchRecordTest, SecretEnvValuesAreLeftOutAndTheirNamesKept) {
  const LaunchRecord r = record_of(ssh_launch(), LaunchMode::kSsh, 4, {"a", "c"});
  EXPECT_EQ(r.env, std::vector<std::string>{"GLOO_SOCKET_IFNAME=eth1"});
  EXPECT_EQ(r.env_not_recorded, (std::vector<std::string>{"HF_TOKEN", "MY_VAR"}));
  const std::string text = to_json(r);
  EXPECT_EQ(text.find("hf_abcdefgh12345"), std::string::npos) << text;
  EXPECT_EQ(text.find("x=y"), std::string::npos) << text;
}

TEST_F(LaunchRecordTest, TheForwardedVariablesOfTheLaunchAreRecordedWithoutSecrets) {
  const char* env[] = {"HF_HOME=/data/hf",
                       "DSTRAIN_DEVICE=cuda",
                       "HF_TOKEN=hf_secret12345",
                       "NCCL_SOCKET_IFNAME=ib0",
                       "MY_VAR=x",
                       "HOME=/home/u",
                       "PATH=/usr/bin",
                       nullptr};
  EXPECT_EQ(recorded_environment(env, {}),
            (std::vector<std::string>{"DSTRAIN_DEVICE=cuda", "HF_HOME=/data/hf",
                                      "NCCL_SOCKET_IFNAME=ib0"}));
  // A name made secret with --secret-env is left out too.
  EXPECT_EQ(recorded_environment(env, {"HF_HOME"}),
            (std::vector<std::string>{"DSTRAIN_DEVICE=cuda", "NCCL_SOCKET_IFNAME=ib0"}));
  LaunchRecord r = record_of(ssh_launch(), LaunchMode::kSsh, 4, {"a", "c"});
  r.environment = recorded_environment(env, {});
  const auto back = parse_launch_record(to_json(r), "launch.json");
  EXPECT_EQ(back.environment, r.environment);
  // A record written before variables were recorded reads as none.
  EXPECT_TRUE(parse_launch_record(R"({"format": "dstrain-launch", "version": 1})", "launch.json")
                  .environment.empty());
}

TEST_F(LaunchRecordTest, SlurmAndLocalLaunchesKeepTheirRanksPerNode) {
  LaunchOptions o;
  o.launch.nproc = 8;
  o.master_addr_given = true;
  o.launch.master_addr = "10.1.2.3";
  const LaunchRecord slurm =
      parse_launch_record(to_json(record_of(o, LaunchMode::kSlurm, 16, {"n1", "n2"})), "x");
  EXPECT_EQ(slurm.mode, LaunchMode::kSlurm);
  EXPECT_EQ(slurm.nproc, 8);
  EXPECT_EQ(slurm.slurm_nodes, 2);
  EXPECT_EQ(slurm.master_addr, "10.1.2.3");
  EXPECT_EQ(describe_launch(slurm).find("under Slurm"), 0u) << describe_launch(slurm);
  EXPECT_NE(describe_launch(slurm).find("2 node(s) x 8 rank(s)"), std::string::npos);

  o.launch.nproc = 3;
  const LaunchRecord local =
      parse_launch_record(to_json(record_of(o, LaunchMode::kLocal, 3, {"localhost"})), "x");
  EXPECT_EQ(local.mode, LaunchMode::kLocal);
  EXPECT_EQ(local.nproc, 3);
  EXPECT_EQ(local.hostfile, "");
  EXPECT_EQ(describe_launch(local), "on one machine: 3 rank(s)");
}

TEST_F(LaunchRecordTest, ADirectoryWithoutARecordHasNone) {
  EXPECT_FALSE(read_launch_record(dir_).has_value());
  EXPECT_FALSE(read_launch_record(dir_ + "/missing").has_value());
}

TEST_F(LaunchRecordTest, AMalformedRecordIsAnInputErrorNamingTheFileAndKey) {
  const std::string path = launch_record_path(dir_);
  auto write = [&](const std::string& text) { std::ofstream(path) << text; };
  write("{not json");
  expect_error([&] { read_launch_record(dir_); }, ErrorKind::kInput, {path, "not valid JSON"});
  write(R"({"format": "something-else", "version": 1})");
  expect_error([&] { read_launch_record(dir_); }, ErrorKind::kInput,
               {path, "not a dstrain launch record"});
  write(R"({"format": "dstrain-launch", "version": 7, "mode": "local"})");
  expect_error([&] { read_launch_record(dir_); }, ErrorKind::kInput, {path, "version 7"});
  write(R"({"format": "dstrain-launch", "version": 1, "mode": "pdsh"})");
  expect_error([&] { read_launch_record(dir_); }, ErrorKind::kInput, {path, "'mode'", "pdsh"});
  write(R"({"format": "dstrain-launch", "version": 1, "mode": "local", "nproc": "eight"})");
  expect_error([&] { read_launch_record(dir_); }, ErrorKind::kInput,
               {path, "'nproc' has the wrong type"});
  write(R"({"format": "dstrain-launch", "version": 1, "mode": "ssh"})");
  expect_error([&] { read_launch_record(dir_); }, ErrorKind::kInput, {path, "ssh.hostfile"});
  EXPECT_EQ(exit_code(ErrorKind::kInput), 2);
}

}  // namespace
}  // namespace dstrain::launcher
