#include "core/teardown_reason.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "core/error.h"

namespace dstrain::teardown {
namespace {

void expect_same(const RankFailure& a, const RankFailure& b) {
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.host, b.host);
  EXPECT_EQ(a.cause, b.cause);
}

TEST(TeardownReason, DecodeReadsBackWhatEncodeWrote) {
  for (const RankFailure& f : {RankFailure{3, "node7", "signal SIGKILL (9)"},
                               RankFailure{0, "", "exit code 1"}, RankFailure{}}) {
    const std::optional<RankFailure> back = decode(encode(f));
    ASSERT_TRUE(back.has_value()) << encode(f);
    expect_same(*back, f);
  }
}

TEST(TeardownReason, EncodingIsOneShortLine) {
  const std::string line =
      encode({12, "h\tost", "a\ncause\r\twith breaks" + std::string(2000, 'x')});
  EXPECT_EQ(line.find('\n'), std::string::npos);
  EXPECT_LT(line.size(), 512u);
  const std::optional<RankFailure> back = decode(line);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->rank, 12);
  EXPECT_EQ(back->host, "h ost");
  EXPECT_EQ(back->cause.substr(0, 20), "a cause  with breaks");
}

TEST(TeardownReason, DecodeRefusesOtherLines) {
  for (const char* line : {"", "rank-failed", "rank-failed\tx\th\tc", "rank-failed\t-2\th\tc",
                           "other\t1\th\tc", "dstrain-agent-ping"}) {
    EXPECT_FALSE(decode(line).has_value()) << line;
  }
}

TEST(TeardownReason, DescribeLeavesOutWhatIsNotKnown) {
  EXPECT_EQ(describe({3, "node7", "signal SIGKILL (9)"}),
            "rank 3 on node7 failed: signal SIGKILL (9)");
  EXPECT_EQ(describe({-1, "node7", "exit code 1"}), "a rank on node7 failed: exit code 1");
  EXPECT_EQ(describe({}), "a rank failed");
}

TEST(TeardownReason, ReceiveReadsWhatWasSentWithoutWaitingForMore) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  EXPECT_FALSE(receive(fds[0]).has_value());  // nothing yet: returns at once, the pipe stays open
  ASSERT_TRUE(send(fds[1], {5, "node1", "exit code 2"}));
  const std::optional<RankFailure> got = receive(fds[0]);
  ASSERT_TRUE(got.has_value());
  expect_same(*got, {5, "node1", "exit code 2"});
  ::close(fds[1]);
  EXPECT_FALSE(receive(fds[0]).has_value());  // the launcher is gone: end of file, no reason
  ::close(fds[0]);
  EXPECT_FALSE(receive(-1).has_value());
}

TEST(TeardownReason, TheVariableNamesAPipeOrNothing) {
  ::unsetenv(kTeardownFdVar);
  EXPECT_EQ(reason_fd_from_env(), -1);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::setenv(kTeardownFdVar, std::to_string(fds[0]).c_str(), 1);
  EXPECT_EQ(reason_fd_from_env(), fds[0]);
  EXPECT_EQ(::fcntl(fds[0], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);  // not passed to programs it runs
  // Inherited by a process whose descriptor of that number is not the pipe.
  const int not_pipe = ::open("/dev/null", O_RDONLY);
  ::setenv(kTeardownFdVar, std::to_string(not_pipe).c_str(), 1);
  EXPECT_EQ(reason_fd_from_env(), -1);
  ::setenv(kTeardownFdVar, "four", 1);
  try {
    reason_fd_from_env();
    ADD_FAILURE() << "no error for a value that is not a number";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("DSTRAIN_TEARDOWN_FD='four'"), std::string::npos);
  }
  ::unsetenv(kTeardownFdVar);
  ::close(not_pipe);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST(TeardownReason, TheGraceIsANumberOfSecondsOrUnknown) {
  ::unsetenv(kGraceVar);
  EXPECT_EQ(grace_from_env(), std::nullopt);
  ::setenv(kGraceVar, "12.5", 1);
  EXPECT_EQ(grace_from_env(), 12.5);
  ::setenv(kGraceVar, "0", 1);
  EXPECT_EQ(grace_from_env(), 0.0);
  for (const char* bad : {"-1", "5s", "nan", "inf"}) {
    ::setenv(kGraceVar, bad, 1);
    try {
      grace_from_env();
      ADD_FAILURE() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(e.what()).find(std::string("DSTRAIN_GRACE_SECONDS='") + bad + "'"),
                std::string::npos)
          << e.what();
    }
  }
  ::unsetenv(kGraceVar);
}

}  // namespace
}  // namespace dstrain::teardown
