// run_with_restarts' rules (restart.h) with attempts that only report: which failures are
// restarted, which end the job at once, and what a run directory has to say about progress.

#include "launcher/restart.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace dstrain::launcher {
namespace {

namespace stdfs = std::filesystem;

class Restarts : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dstrain-restart-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dirs_.out_dir = tmpl;
    dirs_.metrics_file = dirs_.out_dir + "/metrics.jsonl";
    dirs_.checkpoint_dir = dirs_.out_dir + "/ckpt";
  }
  void TearDown() override { stdfs::remove_all(dirs_.out_dir); }

  void log_step(long step) {
    std::ofstream(dirs_.metrics_file, std::ios::app) << "{\"step\": " << step << "}\n";
  }

  static AttemptOutcome failed(int exit_code) {
    AttemptOutcome o;
    o.kind = AttemptOutcome::Kind::kFailed;
    o.exit_code = exit_code;
    o.rank = 1;
    o.host = "node7";
    o.cause = "exit code " + std::to_string(exit_code);
    return o;
  }

  RunDirs dirs_;
  RestartOptions options_{3, 0.0};
};

TEST_F(Restarts, AnInputErrorBeforeTheFirstStepIsNotRestarted) {
  int attempts = 0;
  ::testing::internal::CaptureStderr();
  const int code = run_with_restarts(options_, dirs_, [&](int, const std::string&) {
    ++attempts;
    return failed(2);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 2);
  EXPECT_EQ(attempts, 1);
  EXPECT_NE(err.find("not restarting: rank 1 on host node7 failed with an input error (exit code "
                     "2) before its first step"),
            std::string::npos)
      << err;
}

TEST_F(Restarts, AnInputErrorAfterAStepIsRestartedByTheUsualRules) {
  int attempts = 0;
  ::testing::internal::CaptureStderr();
  const int code = run_with_restarts(options_, dirs_, [&](int k, const std::string&) {
    ++attempts;
    if (k > 0) return AttemptOutcome{};
    log_step(1);
    return failed(2);
  });
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 0);
  EXPECT_EQ(attempts, 2);
}

TEST_F(Restarts, AnInputErrorOfAResumedRunThatLoggedNothingNewIsNotRestarted) {
  log_step(40);  // what the run logged before it was resumed
  int attempts = 0;
  ::testing::internal::CaptureStderr();
  run_with_restarts(options_, dirs_, [&](int, const std::string&) {
    ++attempts;
    return failed(2);
  });
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(attempts, 1);
}

TEST_F(Restarts, OtherFailuresBeforeTheFirstStepAreRestarted) {
  int attempts = 0;
  ::testing::internal::CaptureStderr();
  const int code = run_with_restarts(options_, dirs_, [&](int, const std::string&) {
    ++attempts;
    return failed(1);
  });
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_EQ(attempts, options_.max_restarts + 1);
}

TEST_F(Restarts, WithoutARunDirectoryExitCodeTwoIsRestartedLikeAnyOther) {
  int attempts = 0;
  ::testing::internal::CaptureStderr();
  run_with_restarts(options_, RunDirs{}, [&](int, const std::string&) {
    ++attempts;
    return failed(2);
  });
  ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(attempts, options_.max_restarts + 1);
}

}  // namespace
}  // namespace dstrain::launcher
