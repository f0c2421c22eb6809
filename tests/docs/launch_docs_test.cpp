// docs/launch.md's exit-code table against the launcher's mapping (launcher/exit_status.h,
// ssh_job.h, remote_command.h, core/error.h), and docs/config.md's summary of the launcher's codes
// against the same table: a code changed in the code or in one page only fails here.

#include <sys/wait.h>
#include <csignal>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "launcher/exit_status.h"
#include "launcher/remote_command.h"
#include "launcher/ssh_job.h"
#include "tests/docs/docs_text.h"

namespace dstrain::testing {
namespace {

// The "Code" column of docs/launch.md's "## Exit codes" table -> the "Meaning" column.
std::map<std::string, std::string> documented_launch_codes() {
  const std::string table =
      section(source_file("docs/launch.md"), "## Exit codes", "docs/launch.md");
  std::map<std::string, std::string> codes;
  for (const auto& row : table_rows(table)) {
    if (row.size() >= 2) codes[row[0]] = row[1];
  }
  return codes;
}

int killed_by(int signal) {
  return launcher::shell_exit_code(launcher::decode_child_status(CLD_KILLED, signal));
}

TEST(LaunchDocs, TheExitCodeTableIsTheLaunchersMapping) {
  const std::map<std::string, std::string> documented = documented_launch_codes();
  // Every code the launcher ends with, as the table writes it, and what its meaning must name.
  const std::map<std::string, std::string> expected = {
      {"0", "every rank exited 0"},
      {std::to_string(exit_code(ErrorKind::kUsage)), "bad flags"},
      {"K", "exited with code K"},
      {"128+S", "killed by signal S (" + std::to_string(killed_by(SIGKILL)) + " for SIGKILL)"},
      {std::to_string(128 + SIGINT) + ", " + std::to_string(128 + SIGTERM) + ", " +
           std::to_string(128 + SIGHUP),
       "interrupted by SIGINT, SIGTERM, SIGHUP"},
      {std::to_string(exit_code(ErrorKind::kIo)), "could not start a rank"},
      {std::to_string(launcher::kSshFailureExit), "could not be reached"},
      {std::to_string(launcher::kRemoteSetupExit), "missing on a host"},
  };
  for (const auto& [code, says] : expected) {
    const auto it = documented.find(code);
    ASSERT_NE(it, documented.end()) << "docs/launch.md's exit codes have no row '" << code << "'";
    EXPECT_NE(it->second.find(says), std::string::npos)
        << "docs/launch.md, exit code " << code << ": '" << it->second << "' does not say '" << says
        << "'";
  }
  for (const auto& [code, meaning] : documented) {
    EXPECT_EQ(expected.count(code), 1u) << "docs/launch.md documents exit code '" << code << "' ("
                                        << meaning << "), which the launcher does not use";
  }
  // The mapping the table describes: a rank's signal S is 128 + S.
  EXPECT_EQ(killed_by(SIGTERM), 128 + SIGTERM);
}

TEST(LaunchDocs, ConfigPagesSummaryNamesEveryLauncherCode) {
  const std::string summary =
      section(source_file("docs/config.md"), "## Exit codes", "docs/config.md");
  for (const std::string& code :
       {std::string("128 + S"), std::to_string(killed_by(SIGKILL)), std::to_string(128 + SIGINT),
        std::to_string(128 + SIGTERM), std::to_string(128 + SIGHUP),
        std::to_string(launcher::kSshFailureExit), std::to_string(launcher::kRemoteSetupExit)}) {
    EXPECT_NE(summary.find(code), std::string::npos)
        << "docs/config.md's exit codes do not mention the launcher's code " << code;
  }
}

}  // namespace
}  // namespace dstrain::testing
