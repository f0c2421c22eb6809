#include "launcher/stdin_env.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include "core/error.h"
#include "core/timer.h"

namespace dstrain::launcher {
namespace {

// A pipe whose write end the test fills; the read end is what the agent's stdin would be.
class Pipe {
 public:
  Pipe() { EXPECT_EQ(::pipe(fds_), 0); }
  ~Pipe() {
    ::close(fds_[0]);
    close_write();
  }
  void write(const std::string& text) {
    ASSERT_EQ(::write(fds_[1], text.data(), text.size()), static_cast<ssize_t>(text.size()));
  }
  void close_write() {
    if (fds_[1] >= 0) ::close(fds_[1]);
    fds_[1] = -1;
  }
  int read_end() const { return fds_[0]; }
  std::string rest() {
    close_write();
    std::string out;
    char buf[256];
    ssize_t n = 0;
    while ((n = ::read(fds_[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }

 private:
  int fds_[2] = {-1, -1};
};

TEST(StdinEnv, AnyValueArrivesByteExactAndTheControlLinesAfterItStayUnread) {
  const EnvList env = {{"HF_TOKEN", "hf_abc"},
                       {"ODD_SECRET", "line one\nline two 'quoted' \"dq\" $(x) \\ \xff\t end"},
                       {"EMPTY_KEY", ""}};
  Pipe pipe;
  pipe.write(encode_stdin_env(env) + "dstrain-agent-ping\n");
  EXPECT_EQ(read_stdin_env(pipe.read_end(), 5), env);
  EXPECT_EQ(pipe.rest(), "dstrain-agent-ping\n");
}

TEST(StdinEnv, AnEmptyBlockIsTheEndLineAlone) {
  EXPECT_EQ(encode_stdin_env({}), "dstrain-agent-env-end\n");
  Pipe pipe;
  pipe.write(encode_stdin_env({}));
  EXPECT_TRUE(read_stdin_env(pipe.read_end(), 5).empty());
}

TEST(StdinEnv, AnEndedStreamIsAnErrorSayingSo) {
  Pipe pipe;
  pipe.write("dstrain-agent-env HF_TOKEN 6869\n");
  pipe.close_write();
  try {
    read_stdin_env(pipe.read_end(), 5);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kComm);
    EXPECT_NE(std::string(e.what()).find("stdin ended before the launcher's environment"),
              std::string::npos)
        << e.what();
  }
}

TEST(StdinEnv, ASilentLauncherIsATimeoutAfterTheLimit) {
  Pipe pipe;
  Stopwatch clock;
  try {
    read_stdin_env(pipe.read_end(), 0.3);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kComm);
    EXPECT_NE(std::string(e.what()).find("did not arrive on stdin within 0.3 s"), std::string::npos)
        << e.what();
  }
  EXPECT_GE(clock.seconds(), 0.29);
  EXPECT_LT(clock.seconds(), 3.0);
}

TEST(StdinEnv, MalformedLinesAreRefusedWithoutRepeatingThem) {
  for (const char* line : {"dstrain-agent-env HF_TOKEN 6g\n", "dstrain-agent-env HF_TOKEN 686\n",
                           "dstrain-agent-env BAD-NAME 6869\n", "dstrain-agent-env HF_TOKEN 00\n",
                           "hf_leaked_value\n"}) {
    Pipe pipe;
    pipe.write(line);
    try {
      read_stdin_env(pipe.read_end(), 5);
      FAIL() << "accepted " << line;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << line;
      EXPECT_EQ(std::string(e.what()).find("hf_leaked_value"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace dstrain::launcher
