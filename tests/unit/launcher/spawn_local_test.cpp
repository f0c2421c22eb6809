#include "launcher/spawn_local.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

namespace dstrain::launcher {
namespace {

// In a forked process whose stderr is a pipe to the test: descriptors 0 and 3 up closed and a soft
// limit of 10 descriptors, so that spawn_local's eight pipe ends just fit (0, 3-9) but the child
// cannot copy them above its targets (F_DUPFD from 10 needs a limit above 10). The process exits
// with the rank's exit status.
[[noreturn]] void spawn_with_no_descriptors_left(int stderr_write) {
  ::dup2(stderr_write, 2);
  for (int fd = 3; fd < 1024; ++fd) ::close(fd);
  ::close(0);
  rlimit limit{};
  ::getrlimit(RLIMIT_NOFILE, &limit);
  limit.rlim_cur = 10;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) ::_exit(90);
  RankSpec rank;
  rank.argv = {"/bin/true"};
  int status = 0;
  try {
    const LocalProcess p = spawn_local(rank);
    if (::waitpid(p.pid, &status, 0) != p.pid) ::_exit(91);
  } catch (...) {
    ::_exit(92);
  }
  ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 93);
}

TEST(SpawnLocal, AChildThatCannotSetUpItsDescriptorsSaysSoBeforeExiting127) {
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) spawn_with_no_descriptors_left(pipe_fds[1]);
  ::close(pipe_fds[1]);
  std::string err;
  char buf[256];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) err.append(buf, n);
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 127) << err;
  EXPECT_NE(err.find("dstrain launch: cannot set up the rank's descriptors 1-4: "
                     "fcntl(F_DUPFD_CLOEXEC): Invalid argument"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace dstrain::launcher
