// `dstrain launch --max-restarts`: a failed job comes back by itself from `latest`, with the losses
// of an uninterrupted run; a crash loop stops with its causes; a frozen rank is named, killed and
// restarted; an input error is not retried; a signal to the launcher never restarts. No process
// is left in any case.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

// Two ranks, a checkpoint every 10 of 30 steps, every step logged.
JobSpec restartable_job() {
  JobSpec spec = resumable_job();
  spec.max_steps = 30;
  spec.extra_overrides = {"training.log_interval=1"};
  return spec;
}

std::vector<std::string> launch_args(const std::string& config, const JobSpec& spec,
                                     int max_restarts) {
  std::vector<std::string> args = {"launch",
                                   "--nproc",
                                   std::to_string(spec.nproc),
                                   "--max-restarts",
                                   std::to_string(max_restarts),
                                   "--restart-backoff",
                                   "0.2",
                                   config};
  for (const std::string& kv : spec.extra_overrides) {
    args.push_back("--set");
    args.push_back(kv);
  }
  return args;
}

// Waits for the first committed checkpoint, then SIGKILLs (or stops) `rank` of the job marked
// with `token`.
void hit_rank_after_first_commit(const TempDir& dir, const std::string& token, int rank,
                                 int signal) {
  ASSERT_TRUE(wait_until([&] { return file_exists(dir.file("ckpt/latest")); }, 120));
  pid_t victim = -1;
  ASSERT_TRUE(wait_until(
      [&] {
        victim = rank_pid(processes_with_marker(token), rank);
        return victim > 0;
      },
      20));
  ::kill(victim, signal);
}

TEST(Restart, RankKilledAfterTheFirstCommitCompletesWithTheUninterruptedLosses) {
  TempDir full_dir;
  const JobSpec spec = restartable_job();
  RunResult r = run_job(full_dir, spec);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto full = read_metric(full_dir.file("run/metrics.jsonl"), "train/loss");

  TempDir dir;
  const std::string token = unique_token();
  Child job = start_dstrain(launch_args(write_job_config(dir.path(), spec), spec, 2),
                            {"DSTRAIN_TEST_MARKER=" + token});
  hit_rank_after_first_commit(dir, token, 1, SIGKILL);
  r = finish(job, 180);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("dstrain launch: restart 1"), std::string::npos) << r.err;
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token).empty(); }, 10));

  const auto restarted = read_metric(dir.file("run/metrics.jsonl"), "train/loss");
  ASSERT_EQ(restarted.size(), full.size());
  for (const auto& [step, loss] : full) EXPECT_EQ(restarted.at(step), loss) << "step " << step;

  const auto summary = nlohmann::json::parse(read_text(dir.file("run/summary.json")));
  ASSERT_EQ(summary["restarts"].get<int>(), 1) << summary.dump();
  const auto& cause = summary["restart_causes"][0];
  EXPECT_EQ(cause["rank"].get<int>(), 1);
  EXPECT_EQ(cause["cause"].get<std::string>(), "signal SIGKILL (9)");
  EXPECT_EQ(cause["resumed_from"].get<std::string>().rfind("step_", 0), 0u);
  EXPECT_NE(read_text(dir.file("run/report.html")).find("<line class=\"mark\""), std::string::npos);
}

// Every rank the launcher stops because another failed says which one failed (train/
// rank_lifetime.h), not only rank 0, whose tracked runs end FAILED: rank 2 of 3 killed, ranks 0 and
// 1 name it on their stderr before they die by the SIGTERM.
TEST(Restart, EveryRankStoppedForAFailedOneNamesIt) {
  TempDir dir;
  JobSpec spec = restartable_job();
  spec.nproc = 3;
  const std::string token = unique_token();
  Child job = start_dstrain(launch_args(write_job_config(dir.path(), spec), spec, 0),
                            {"DSTRAIN_TEST_MARKER=" + token});
  hit_rank_after_first_commit(dir, token, 2, SIGKILL);
  const RunResult r = finish(job, 120);
  EXPECT_NE(r.exit_code, 0);
  for (const char* rank : {"[rank 0]", "[rank 1]"}) {
    EXPECT_NE(r.err.find(std::string(rank) +
                         " warning: Terminated (the launcher stops the job: rank 2 on "),
              std::string::npos)
        << rank << "\n"
        << r.err;
  }
  EXPECT_NE(r.err.find("failed: signal SIGKILL (9)): stopping"), std::string::npos) << r.err;
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token).empty(); }, 10));
}

TEST(Restart, ARankThatAlwaysFailsStopsAfterTheRestartsWithItsCauses) {
  TempDir dir;
  const std::string token = unique_token();
  Child job =
      start_dstrain({"launch", "--nproc", "2", "--max-restarts", "2", "--restart-backoff", "0.1",
                     "--exec", "--", "sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60"},
                    {"DSTRAIN_TEST_MARKER=" + token});
  const RunResult r = finish(job, 120);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("dstrain launch: restart 2 "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("dstrain launch: restart 3 "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("giving up: 3 failure(s) without a new checkpoint, more than "
                       "--max-restarts 2"),
            std::string::npos)
      << r.err;
  for (int attempt = 0; attempt < 3; ++attempt) {
    EXPECT_NE(r.err.find("attempt " + std::to_string(attempt) + ": rank 1 on host "),
              std::string::npos)
        << r.err;
  }
  EXPECT_NE(r.err.find("exit code 3"), std::string::npos);
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token).empty(); }, 10));
}

// A stopped rank (a frozen process, host or container) goes silent; the launcher's heartbeat watch
// names and kills it after DSTRAIN_COMM_TIMEOUT, rank 0 (which hosts the rendezvous store) as
// much as any other, and the job comes back from `latest`.
class FrozenRank : public ::testing::TestWithParam<int> {};

TEST_P(FrozenRank, IsNamedKilledAndRestartedFromLatest) {
  const int victim = GetParam();
  TempDir dir;
  const JobSpec spec = restartable_job();
  const std::string token = unique_token();
  Child job = start_dstrain(launch_args(write_job_config(dir.path(), spec), spec, 1),
                            {"DSTRAIN_TEST_MARKER=" + token, "DSTRAIN_COMM_TIMEOUT=5"});
  hit_rank_after_first_commit(dir, token, victim, SIGSTOP);
  const RunResult r = finish(job, 240);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(
      r.err.find("dstrain launch: rank " + std::to_string(victim) + " failed on host localhost"),
      std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("stopped responding (no heartbeat for"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dstrain launch: restart 1"), std::string::npos) << r.err;
  EXPECT_EQ(read_metric(dir.file("run/metrics.jsonl"), "train/loss").size(), 30u);
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token).empty(); }, 10));
  const auto summary = nlohmann::json::parse(read_text(dir.file("run/summary.json")));
  const auto& cause = summary["restart_causes"][0];
  EXPECT_EQ(cause["rank"].get<int>(), victim);
  EXPECT_EQ(cause["cause"].get<std::string>().rfind("stopped responding", 0), 0u) << cause.dump();
}

INSTANTIATE_TEST_SUITE_P(Restart, FrozenRank, ::testing::Values(0, 1),
                         [](const auto& info) { return "Rank" + std::to_string(info.param); });

TEST(Restart, AnInputErrorBeforeTheFirstStepIsNotRetried) {
  TempDir dir;
  JobSpec spec = restartable_job();
  const std::string token = unique_token();
  std::ofstream(dir.file("broken.yaml")) << "{not json\n";
  spec.extra_overrides.push_back("model.tokenizer=" + dir.file("broken.yaml"));
  Child job = start_dstrain(launch_args(write_job_config(dir.path(), spec), spec, 3),
                            {"DSTRAIN_TEST_MARKER=" + token});
  const RunResult r = finish(job, 120);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("dstrain launch: not restarting: rank "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("failed with an input error (exit code 2) before its first step"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("dstrain launch: restart 1"), std::string::npos) << r.err;
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token).empty(); }, 10));
}

TEST(Restart, MinNodesThatCannotKeepTheGlobalBatchIsRefusedAtPlanTime) {
  // 3 hosts of 1 rank, micro 2: a global batch of 6 cannot be kept on 2 ranks (6 is not a
  // multiple of 4); with accumulation 2 (12) it can. A dry run connects to nobody.
  TempDir dir;
  std::ofstream(dir.file("hosts")) << "10.9.9.1 slots=1\n10.9.9.2 slots=1\n10.9.9.3 slots=1\n";
  JobSpec spec;
  spec.micro = 2;
  const std::string cfg = write_job_config(dir.path(), spec);
  const std::vector<std::string> args = {"launch",      "--hostfile", dir.file("hosts"),
                                         "--min-nodes", "2",          "--max-restarts",
                                         "1",           "--dry-run",  cfg};
  RunResult r = run_dstrain(args);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--min-nodes 2 lets the job shrink to 2 rank(s): the global batch 6 "
                       "(micro 2 x accumulation 1 x 3 ranks) cannot be kept"),
            std::string::npos)
      << r.err;
  std::vector<std::string> kept = args;
  kept.insert(kept.end(), {"--set", "training.gradient_accumulation_steps=2"});
  r = run_dstrain(kept);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(Restart, SigintToTheLauncherNeverRestarts) {
  TempDir dir;
  const std::string token = unique_token();
  Child job = start_dstrain(
      {"launch", "--nproc", "2", "--max-restarts", "3", "--exec", "--", "sleep", "60"},
      {"DSTRAIN_TEST_MARKER=" + token});
  ASSERT_TRUE(wait_until([&] { return processes_with_marker(token).size() >= 3; }, 20));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ::kill(job.pid, SIGINT);
  const RunResult r = finish(job, 30);
  EXPECT_EQ(r.exit_code, 130) << r.err;
  EXPECT_EQ(r.err.find("restart"), std::string::npos) << r.err;
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token).empty(); }, 10));
}

}  // namespace
}  // namespace dstrain::testing
