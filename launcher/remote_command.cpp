#include "launcher/remote_command.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/secrets.h"
#include "launcher/remote_env.h"
#include "launcher/shell_quote.h"

namespace dstrain::launcher {
namespace {

// `test || { print message; exit }`, with the message quoted like any other word.
std::string guard(const std::string& test, const std::string& message) {
  return fmt::format("{} || {{ printf '%s\\n' {} >&2; exit {}; }}\n", test, shell_quote(message),
                     kRemoteSetupExit);
}

}  // namespace

std::string build_remote_command(const RemoteCommand& command) {
  if (command.argv.empty() || command.argv[0].empty()) {
    fail(ErrorKind::kInternal, "remote command without a program");
  }
  std::string script;
  if (!command.cwd.empty()) {
    script += guard("cd -- " + shell_quote(command.cwd) + " 2>/dev/null",
                    "dstrain launch: the working directory " + command.cwd +
                        " does not exist here (see --remote-cwd)");
  }
  const std::string& program = command.argv[0];
  script += guard("test -x " + shell_quote(program),
                  "dstrain launch: " + program + " is not an executable file here");
  for (const auto& kv : command.env) {
    if (!is_env_name(kv.first)) {
      fail(ErrorKind::kUsage, "'{}' is not a valid environment variable name", kv.first);
    }
    if (secrets::is_secret_name(kv.first)) {
      fail(ErrorKind::kInternal, "{} is secret and must not be in a remote command line", kv.first);
    }
    script += "export " + kv.first + "=" + shell_quote(kv.second) + "\n";
  }
  script += "exec " + shell_join(command.argv) + "\n";
  return script;
}

}  // namespace dstrain::launcher
