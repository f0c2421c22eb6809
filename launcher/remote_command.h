#pragma once
// The one shell command line an SSH server runs to start a node agent. The remote side runs it
// through the user's login shell (sh, bash, zsh, dash: POSIX quoting), so every word is quoted
// with shell_quote and every variable name is checked: no host name, path, value or argument can
// inject shell syntax (tested by running the result through a real `sh -c`).
//
// The command: cd to the working directory, check the program is executable, export the
// variables, then exec the program. A secret variable (core/secrets.h) is refused as a bug
// (kInternal): while the command runs it is the remote shell's argv, which every user of the host
// can read; secrets travel on the channel instead (stdin_env.h). A missing directory or program
// ends the command with kRemoteSetupExit and a message naming what is missing (the launcher adds
// the host).

#include <string>
#include <vector>

#include "launcher/plan.h"

namespace dstrain::launcher {

constexpr int kRemoteSetupExit = 126;

struct RemoteCommand {
  std::string cwd;                // "" = the remote login directory
  EnvList env;                    // names must satisfy is_env_name (Error(kUsage) otherwise)
  std::vector<std::string> argv;  // argv[0]: absolute path of the program on the remote host
};

std::string build_remote_command(const RemoteCommand& command);

}  // namespace dstrain::launcher
