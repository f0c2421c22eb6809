// Real Gloo between real processes: each test starts a world of comm_test_worker processes on
// 127.0.0.1 and checks what every rank reported.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "world.h"

namespace dstrain::comm::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A world of `world_size` workers running `scenario`: every rank exits 0 and reports OK.
void expect_every_rank_ok(const std::string& scenario, int world_size) {
  WorldSpec spec;
  spec.scenario = scenario;
  spec.world_size = world_size;
  std::vector<RankResult> results = run_world(spec);
  for (int r = 0; r < spec.world_size; ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " of " << spec.world_size;
    EXPECT_EQ(results[r].result, "OK\n") << "rank " << r << " of " << spec.world_size;
  }
}

class GlooCollectives : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectives, ResultsAndByteCountsMatchTheoryOnEveryRank) {
  expect_every_rank_ok("collectives", GetParam());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes1To4, GlooCollectives, ::testing::Values(1, 2, 3, 4));

class GlooGroups : public ::testing::TestWithParam<int> {};

TEST_P(GlooGroups, AllToAllAndSplitGroupsWorkBesideTheWorld) {
  expect_every_rank_ok("groups", GetParam());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes1To4, GlooGroups, ::testing::Values(1, 2, 3, 4));

class GlooPointToPoint : public ::testing::TestWithParam<int> {};

TEST_P(GlooPointToPoint, TransfersArriveInOrderWithoutDeadlockAndAreCounted) {
  expect_every_rank_ok("point_to_point", GetParam());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes1To4, GlooPointToPoint, ::testing::Values(1, 2, 3, 4));

// A receive from a rank that died is an error naming the transfer with the world's rank (the
// receive went through a group of two) and the dead rank, not a hang.
TEST(GlooPointToPointFailure, APeerThatDiesIsNamed) {
  WorldSpec spec{"peer_dies_sending", 3, {}, /*comm_timeout_s=*/30, /*deadline_s=*/60};
  std::vector<RankResult> results = run_world(spec);
  EXPECT_EQ(results[2].exit_code, 3) << "the dying rank should exit with its own code";
  EXPECT_EQ(results[0].exit_code, 0) << "rank 0 hung or crashed";
  EXPECT_THAT(results[0].result,
              HasSubstr("ERROR [communication error] recv from rank 2 failed on rank 0 of 3: "));
  EXPECT_THAT(results[0].result, HasSubstr("; rank 2 stopped responding (no heartbeat for 3.0 s)"));
}

// A live peer that never sends: the receive times out after the communicator's timeout, and the
// peer is named neither dead nor behind (transfers are not numbered).
TEST(GlooPointToPointFailure, APeerThatNeverSendsIsATimeoutNotAHang) {
  WorldSpec spec{"peer_never_sends", 2, {}, /*comm_timeout_s=*/3, /*deadline_s=*/40};
  const auto start = std::chrono::steady_clock::now();
  std::vector<RankResult> results = run_world(spec);
  EXPECT_EQ(results[1].exit_code, 0) << "the silent rank hung or crashed";
  EXPECT_EQ(results[0].exit_code, 0) << "rank 0 hung or crashed";
  EXPECT_THAT(results[0].result, HasSubstr("ERROR [timeout] recv from rank 1 failed on rank 0 of 2 "
                                           "after the 3 s timeout"));
  EXPECT_THAT(results[0].result, Not(HasSubstr("stopped responding")));
  EXPECT_THAT(results[0].result, Not(HasSubstr("had not reached")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(GlooRendezvous, TimeoutNamesTheRankThatNeverJoined) {
  WorldSpec spec{"rendezvous", 3, {0, 1}, /*comm_timeout_s=*/2, /*deadline_s=*/20};
  std::vector<RankResult> results = run_world(spec);
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r;
    EXPECT_THAT(results[r].result, HasSubstr("ERROR [timeout] rendezvous at 127.0.0.1:"))
        << "rank " << r;
    EXPECT_THAT(results[r].result, HasSubstr("timed out after 2 s: rank 2 of 3 never joined"))
        << "rank " << r;
  }
}

// The survivors get an error from the closed connection, not a timeout, and it names only the rank
// that died, never one that saw the failure too and exited first (on a loaded machine the ranks'
// errors and exits are seconds apart: run it with the machine busy). The timeout is long only so
// that ranks slow to start on a busy machine still meet at the rendezvous.
TEST(GlooCollectiveFailure, PeerDyingMidCollectiveIsAnErrorNamingItNotAHang) {
  WorldSpec spec{"peer_dies", 3, {}, /*comm_timeout_s=*/30, /*deadline_s=*/60};
  std::vector<RankResult> results = run_world(spec);
  EXPECT_EQ(results[2].exit_code, 3) << "the dying rank should exit with its own code";
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " hung or crashed";
    EXPECT_THAT(results[r].result,
                HasSubstr("ERROR [communication error] all_reduce failed on rank " +
                          std::to_string(r) + " of 3: "));
    EXPECT_THAT(results[r].result,
                HasSubstr("; rank 2 stopped responding (no heartbeat for 3.0 s)\n"))
        << "rank " << r;
  }
}

// A slow rank is alive: the others time out waiting for it, and their errors say it had not reached
// the collective, never that it stopped responding. The slow rank arrives after twice the timeout.
TEST(GlooCollectiveFailure, SlowPeerIsNamedSlowNotDead) {
  WorldSpec spec{"peer_slow", 3, {}, /*comm_timeout_s=*/10, /*deadline_s=*/60};
  std::vector<RankResult> results = run_world(spec);
  EXPECT_EQ(results[2].exit_code, 0) << "the slow rank hung or crashed";
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " hung or crashed";
    EXPECT_THAT(results[r].result, HasSubstr("ERROR [timeout] all_reduce failed on rank " +
                                             std::to_string(r) + " of 3 after the 10 s timeout"));
    EXPECT_THAT(results[r].result,
                HasSubstr("; rank 2 is alive but had not reached the all_reduce that failed"))
        << "rank " << r;
    EXPECT_THAT(results[r].result, Not(HasSubstr("stopped responding"))) << "rank " << r;
  }
}

// Rank 0 hosts the rendezvous store; stopped, it keeps its connections open and answers nothing.
// The others fail after the timeout plus a bounded diagnosis that names the silent store, and exit:
// nothing of theirs may wait on it forever (c10d's store client has no limit of its own). The
// stopped rank is killed at the deadline.
TEST(GlooCollectiveFailure, AStoppedRankZeroIsAnErrorNotAHang) {
  WorldSpec spec{"rank0_stops", 3, {}, /*comm_timeout_s=*/3, /*deadline_s=*/40};
  const auto start = std::chrono::steady_clock::now();
  std::vector<RankResult> results = run_world(spec);
  EXPECT_EQ(results[0].exit_code, -1) << "rank 0 stays stopped until the deadline";
  for (int r : {1, 2}) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " hung or crashed";
    EXPECT_THAT(results[r].result, HasSubstr("ERROR [timeout] all_reduce failed on rank " +
                                             std::to_string(r) + " of 3 after the 3 s timeout"))
        << "rank " << r;
    EXPECT_THAT(results[r].result, HasSubstr("the rendezvous store at 127.0.0.1:")) << "rank " << r;
    EXPECT_THAT(results[r].result, HasSubstr("did not answer within 6.0 s: rank 0, which hosts it, "
                                             "is frozen"))
        << "rank " << r;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(45));
}

}  // namespace
}  // namespace dstrain::comm::testing
