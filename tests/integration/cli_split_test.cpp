// `dstrain` runs launch, report, trace, version and help without LibTorch and hands every other
// command to dstrain-worker beside it (apps/dstrain/command_info.h); to the user it is one CLI.
// LD_DEBUG=files makes the dynamic loader name every library it loads, which shows what a command
// pays for.

#include <sys/wait.h>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"

namespace dstrain::testing {
namespace {

std::string worker_binary() {
  std::string binary = DSTRAIN_BINARY;
  return binary.substr(0, binary.rfind('/') + 1) + "dstrain-worker";
}

// Runs `dstrain args` and returns what the dynamic loader reported loading (stderr).
std::string loaded_libraries(const std::vector<std::string>& args) {
  RunResult r = run_dstrain(args, {"LD_DEBUG=files"}, 30);
  EXPECT_FALSE(r.timed_out);
  return r.err;
}

TEST(CliSplit, VersionHelpAndLaunchDoNotLoadLibTorch) {
  for (std::vector<std::string> args :
       {std::vector<std::string>{"version"}, {"--help"}, {"launch", "--help"}}) {
    std::string loads = loaded_libraries(args);
    EXPECT_TRUE(contains(loads, "libssh")) << "LD_DEBUG shows no loads at all:\n" << loads;
    EXPECT_FALSE(contains(loads, "libtorch")) << args[0] << " loaded LibTorch";
  }
  // The check can see LibTorch: the worker's commands load it.
  EXPECT_TRUE(contains(loaded_libraries({"train", "--help"}), "libtorch_cpu"));
}

TEST(CliSplit, LocalLauncherProcessHasNoLibTorchMapped) {
  RunResult r = run_dstrain({"launch", "--nproc", "1", "--exec", "--", "sh", "-c",
                             "echo maps=$(grep -c libtorch "
                             "/proc/$PPID/maps)"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[rank 0] maps=0\n")) << r.out;
}

TEST(CliSplit, HelpListsEveryCommandAsTheWorkerDoes) {
  RunResult front = run_dstrain({"--help"});
  ASSERT_EQ(front.exit_code, 0) << front.err;
  for (const char* command :
       {"launch", "train", "resume", "export", "estimate", "download", "data", "ckpt", "version"}) {
    EXPECT_TRUE(contains(front.out, "\n  " + std::string(command) + " ")) << front.out;
  }
  EXPECT_FALSE(contains(front.out, "debug")) << "debug is hidden";
  // The worker's own help, which knows every command's options, reads the same.
  std::string worker_help;
  FILE* p = ::popen((worker_binary() + " --help").c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) worker_help.append(buf, n);
  EXPECT_EQ(::pclose(p), 0);
  EXPECT_EQ(front.out, worker_help);
}

TEST(CliSplit, WorkerCommandsKeepTheirHelpErrorsAndExitCodes) {
  RunResult help = run_dstrain({"train", "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
  EXPECT_TRUE(contains(help.out, "Usage: dstrain train [OPTIONS] CONFIG")) << help.out;
  EXPECT_TRUE(contains(help.out, "--print-config")) << help.out;

  RunResult missing = run_dstrain({"train"});
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  EXPECT_TRUE(contains(missing.err, "CONFIG is required")) << missing.err;

  RunResult bad = run_dstrain({"export", "--no-such-flag"});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_TRUE(contains(bad.err, "dstrain: error:")) << bad.err;

  RunResult all = run_dstrain({"--help-all"});
  EXPECT_EQ(all.exit_code, 0) << all.err;
  for (const char* option : {"--print-config", "--hostfile", "--ssh-keepalive", "--revision"}) {
    EXPECT_TRUE(contains(all.out, option)) << option << " missing from --help-all";
  }
}

// `dstrain` copied somewhere without its worker: worker commands and training launches say what is
// missing instead of failing obscurely (the launcher checks before starting any rank).
TEST(CliSplit, MissingWorkerIsOneClearError) {
  TempDir dir;
  std::string lone = dir.file("dstrain");
  std::filesystem::copy_file(DSTRAIN_BINARY, lone);
  std::filesystem::permissions(lone, std::filesystem::perms::owner_all);
  std::ofstream(dir.file("run.yaml")) << "model:\n  name_or_path: org/tiny\n"
                                      << "data:\n  train_path: train.txt\n";
  std::string worker = dir.file("dstrain-worker");
  for (const std::string& command : {lone + " train run.yaml", "cd " + dir.path() + " && " + lone +
                                                                   " launch --nproc 2 run.yaml"}) {
    FILE* p = ::popen((command + " 2>&1").c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    int status = ::pclose(p);
    EXPECT_EQ(WEXITSTATUS(status), 1) << command << "\n" << out;
    EXPECT_TRUE(contains(out, worker)) << command << "\n" << out;
  }
  EXPECT_EQ(run_dstrain({"version"}).exit_code, 0);  // the installed pair is untouched
}

}  // namespace
}  // namespace dstrain::testing
