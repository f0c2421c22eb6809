#include "launcher/remote_command.h"

#include <sys/wait.h>
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/common/temp_dir.h"

namespace dstrain::launcher {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> split_nul(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : text) {
    if (c == '\0') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `command` exactly as an SSH server would: `sh -c command`. Returns the exit code.
int run_sh(const std::string& command) {
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

const std::vector<std::string> kHostile = {"plain",
                                           "two words",
                                           "it's",
                                           "\"double\"",
                                           "$HOME",
                                           "${HOME}",
                                           "`id`",
                                           "$(touch PWNED)",
                                           "new\nline",
                                           "back\\slash",
                                           ";touch PWNED;",
                                           "&& touch PWNED",
                                           "| cat",
                                           "*",
                                           "~",
                                           "-n",
                                           "",
                                           "\ttab",
                                           "# not a comment",
                                           "!bang",
                                           "caf\xc3\xa9",
                                           "'\"'\"'",
                                           "a'b\"c$d`e\\f",
                                           "--",
                                           "=",
                                           "trailing\\",
                                           "\x01\x7f"};

TEST(RemoteCommand, HostileValuesArriveByteExactThroughARealShell) {
  testing::TempDir tmp;
  std::string cwd = tmp.path().string() + "/dir with 'quotes' $(x) and\nnewline";
  fs::create_directories(cwd);
  RemoteCommand command;
  command.cwd = cwd;
  command.env = {{"DUMP_OUT", tmp.path().string() + "/out"}};
  for (size_t i = 0; i < kHostile.size(); ++i) {
    command.env.emplace_back("HOSTILE_" + std::to_string(i), kHostile[i]);
  }
  command.argv = {"/bin/sh", "-c",
                  "{ printf '%s\\0' \"$PWD\"; printf '%s\\0' \"$@\"; } > \"$DUMP_OUT\"; "
                  "env -0 > \"$DUMP_OUT.env\"",
                  "argv0"};
  command.argv.insert(command.argv.end(), kHostile.begin(), kHostile.end());
  ASSERT_EQ(run_sh(build_remote_command(command)), 0);

  std::vector<std::string> dumped = split_nul(slurp(tmp.path().string() + "/out"));
  ASSERT_EQ(dumped.size(), kHostile.size() + 1);
  EXPECT_EQ(dumped[0], cwd);
  for (size_t i = 0; i < kHostile.size(); ++i) EXPECT_EQ(dumped[i + 1], kHostile[i]) << i;

  std::map<std::string, std::string> env;
  for (const std::string& kv : split_nul(slurp(tmp.path().string() + "/out.env"))) {
    env[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  }
  for (size_t i = 0; i < kHostile.size(); ++i) {
    EXPECT_EQ(env["HOSTILE_" + std::to_string(i)], kHostile[i]) << i;
  }
  EXPECT_FALSE(fs::exists(cwd + "/PWNED"));
  EXPECT_FALSE(fs::exists(tmp.path().string() + "/PWNED"));
}

TEST(RemoteCommand, MissingWorkingDirectoryIsNamed) {
  RemoteCommand command;
  command.cwd = "/nonexistent/dir x";
  command.argv = {"/bin/true"};
  EXPECT_EQ(run_sh(build_remote_command(command) + " 2>/dev/null"), kRemoteSetupExit);
  EXPECT_NE(build_remote_command(command).find("/nonexistent/dir x does not exist"),
            std::string::npos);
}

TEST(RemoteCommand, MissingProgramIsNamed) {
  RemoteCommand command;
  command.argv = {"/nonexistent/dstrain", "launch"};
  std::string script = build_remote_command(command);
  EXPECT_EQ(run_sh(script + " 2>/dev/null"), kRemoteSetupExit);
  EXPECT_NE(script.find("/nonexistent/dstrain is not an executable file"), std::string::npos);
}

TEST(RemoteCommand, RejectsInvalidVariableNames) {
  RemoteCommand command;
  command.argv = {"/bin/true"};
  for (const char* bad : {"A;B", "1X", "", "A B", "$(x)"}) {
    command.env = {{bad, "v"}};
    EXPECT_THROW(build_remote_command(command), Error) << bad;
  }
}

// Secrets travel on the channel (stdin_env.h); the command line refusing them is the last guard.
TEST(RemoteCommand, RefusesSecretVariables) {
  RemoteCommand command;
  command.argv = {"/bin/true"};
  for (const char* name : {"HF_TOKEN", "WANDB_API_KEY", "MLFLOW_TRACKING_PASSWORD"}) {
    command.env = {{name, "value"}};
    try {
      build_remote_command(command);
      FAIL() << "accepted " << name;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInternal) << name;
    }
  }
}

}  // namespace
}  // namespace dstrain::launcher
