#include "launcher/exit_status.h"

#include <sys/wait.h>
#include <csignal>

#include <gtest/gtest.h>

namespace dstrain::launcher {
namespace {

TEST(ExitStatus, ExitCodeIsPassedThrough) {
  RankExit e = decode_child_status(CLD_EXITED, 3);
  EXPECT_FALSE(e.signaled);
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(shell_exit_code(e), 3);
  EXPECT_EQ(describe(e), "exit code 3");
  EXPECT_TRUE(decode_child_status(CLD_EXITED, 0).ok());
}

TEST(ExitStatus, SignalMapsTo128PlusSignal) {
  RankExit killed = decode_child_status(CLD_KILLED, SIGKILL);
  EXPECT_TRUE(killed.signaled);
  EXPECT_EQ(shell_exit_code(killed), 137);
  EXPECT_EQ(describe(killed), "signal SIGKILL (9)");
  RankExit dumped = decode_child_status(CLD_DUMPED, SIGSEGV);
  EXPECT_EQ(shell_exit_code(dumped), 128 + SIGSEGV);
  EXPECT_EQ(signal_name(SIGTERM), "SIGTERM");
  EXPECT_EQ(signal_name(SIGINT), "SIGINT");
  EXPECT_EQ(signal_name(64), "signal 64");
}

}  // namespace
}  // namespace dstrain::launcher
