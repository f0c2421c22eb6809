// The supervisor's heartbeat watch (supervisor.h, core/liveness.h) with real processes: a stopped
// rank is found, named and killed within the silence limit, whichever rank it is; a rank that
// fails because a peer froze does not take the blame; a program that never beats is not watched.

#include "launcher/supervisor.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

namespace stdfs = std::filesystem;

class SupervisorWatch : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dstrain-supervisor-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { stdfs::remove_all(dir_); }

  std::string pid_file(int rank) const { return dir_ + "/rank" + std::to_string(rank) + ".pid"; }

  // Rank r runs the beater for seconds[r] and exits with codes[r].
  std::vector<RankSpec> beaters(const std::vector<double>& seconds, const std::vector<int>& codes) {
    std::vector<RankSpec> ranks;
    for (size_t r = 0; r < seconds.size(); ++r) {
      RankSpec spec;
      spec.rank = static_cast<int>(r);
      spec.host = "localhost";
      spec.argv = {LIVENESS_BEATER, pid_file(spec.rank), std::to_string(seconds[r]),
                   std::to_string(codes[r])};
      ranks.push_back(spec);
    }
    return ranks;
  }

  // The pid rank `rank` wrote, waiting up to 20 s for it.
  pid_t wait_for_pid(int rank) const {
    for (int i = 0; i < 2000; ++i) {
      std::ifstream in(pid_file(rank));
      pid_t pid = -1;
      if (in >> pid) return pid;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  static SupervisorOptions options(double silence_limit) {
    SupervisorOptions o;
    o.grace_seconds = 1.0;
    o.silence_limit_seconds = silence_limit;
    return o;
  }

  std::string dir_;
};

class StoppedRank : public SupervisorWatch, public ::testing::WithParamInterface<int> {};

TEST_P(StoppedRank, IsNamedAndKilledWithinTheSilenceLimit) {
  const int victim = GetParam();
  auto job = std::async(std::launch::async, [&] {
    return run_local_job(beaters({60, 60, 60}, {0, 0, 0}), options(2.0));
  });
  const pid_t pid = wait_for_pid(victim);
  ASSERT_GT(pid, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // it has beaten by now
  const auto stopped_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  ASSERT_EQ(job.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - stopped_at).count();
  const JobOutcome outcome = job.get();
  EXPECT_EQ(outcome.cause, JobOutcome::Cause::kRankFailed);
  EXPECT_EQ(outcome.failed_rank, victim);
  EXPECT_LT(took, 2.0 + 3.0);
  const RankReport& r = outcome.ranks[static_cast<size_t>(victim)];
  EXPECT_GE(r.silent_seconds, 2.0);
  EXPECT_EQ(r.exit.signal, SIGKILL);
  EXPECT_NE(describe(r).find("stopped responding (no heartbeat for"), std::string::npos)
      << describe(r);
  const std::string summary = format_summary(outcome, "testhost");
  EXPECT_NE(summary.find("rank " + std::to_string(victim) + " failed on host localhost"),
            std::string::npos)
      << summary;
  for (const RankReport& other : outcome.ranks) {
    if (other.rank != victim) {
      EXPECT_TRUE(other.stopped_by_launcher) << other.rank;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FirstAndLast, StoppedRank, ::testing::Values(0, 2),
                         [](const auto& info) { return "Rank" + std::to_string(info.param); });

TEST_F(SupervisorWatch, ARankFailingAfterAPeerFroze_BlamesTheFrozenPeer) {
  // Rank 1 is stopped; rank 0 then fails (as its collective would time out) after more than
  // kSuspectSilenceSeconds but before the silence limit of 60 s.
  auto job = std::async(std::launch::async, [&] {
    return run_local_job(beaters({kSuspectSilenceSeconds + 3.0, 60}, {1, 0}), options(60.0));
  });
  const pid_t pid = wait_for_pid(1);
  ASSERT_GT(pid, 0);
  ASSERT_EQ(wait_for_pid(0) > 0, true);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  ASSERT_EQ(job.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  const JobOutcome outcome = job.get();
  EXPECT_EQ(outcome.failed_rank, 1);
  EXPECT_GT(outcome.ranks[1].silent_seconds, kSuspectSilenceSeconds);
}

TEST_F(SupervisorWatch, AFailureWithEveryRankBeatingBlamesTheFailedRank) {
  const JobOutcome outcome = run_local_job(beaters({1.5, 60}, {3, 0}), options(60.0));
  EXPECT_EQ(outcome.failed_rank, 0);
  EXPECT_EQ(outcome.exit_code, 3);
  EXPECT_EQ(outcome.ranks[0].silent_seconds, 0);
  EXPECT_EQ(outcome.ranks[1].silent_seconds, 0);
}

TEST_F(SupervisorWatch, AProgramThatNeverBeatsIsNotWatched) {
  RankSpec spec;
  spec.host = "localhost";
  spec.argv = {"/bin/sleep", "2"};
  const JobOutcome outcome = run_local_job({spec}, options(0.5));
  EXPECT_EQ(outcome.cause, JobOutcome::Cause::kSuccess);
  EXPECT_EQ(outcome.exit_code, 0);
}

TEST(SilenceLimit, ComesFromTheCommunicationTimeout) {
  ::unsetenv("DSTRAIN_COMM_TIMEOUT");
  EXPECT_EQ(silence_limit_from_env(), 300.0);
  ::setenv("DSTRAIN_COMM_TIMEOUT", "6.5", 1);
  EXPECT_EQ(silence_limit_from_env(), 6.5);
  ::setenv("DSTRAIN_COMM_TIMEOUT", "soon", 1);
  EXPECT_THROW(silence_limit_from_env(), Error);
  ::unsetenv("DSTRAIN_COMM_TIMEOUT");
}

}  // namespace
}  // namespace dstrain::launcher
