#pragma once
// The environment a remote node agent (and so every remote rank) receives on top of the remote
// login environment. Remote shells start clean, so what matters to a training job is carried over
// explicitly, in this order (a later source wins for the same name):
//   1. every variable of the launcher whose name starts with one of kForwardedPrefixes, and those
//      named with --secret-env;
//   2. ~/.dstrain_env, then ./.dstrain_env (KEY=VALUE lines; `#` comment lines and blank lines
//      allowed; the value is the rest of the line, taken literally);
//   3. --env KEY=VALUE flags.
// Errors (kInput/kUsage) name the file and line, or the flag.

#include <string>
#include <vector>

#include "launcher/plan.h"

namespace dstrain::launcher {

extern const char* const kForwardedPrefixes[];  // NCCL_, GLOO_, DSTRAIN_, ... (null-terminated)

// True for a shell variable name: [A-Za-z_][A-Za-z0-9_]*.
bool is_env_name(const std::string& name);

// Variables of `environ` (NAME=value strings, null-terminated) with a forwarded prefix, sorted.
EnvList forwarded_variables(const char* const* environ);

// Parses .dstrain_env text; `path` only appears in messages.
EnvList parse_env_file(const std::string& text, const std::string& path);

// "KEY=VALUE" from --env; Error(kUsage) otherwise.
std::pair<std::string, std::string> parse_env_flag(const std::string& text);

// Sets or replaces `name` in `env`, keeping the first position.
void set_env(EnvList& env, const std::string& name, const std::string& value);

struct RemoteEnvSources {
  const char* const* environ = nullptr;
  std::vector<std::string> named;  // forwarded whatever their prefix (--secret-env), when set
  std::string home;                // "" = skip ~/.dstrain_env
  std::string cwd;                 // "" = skip ./.dstrain_env
  std::vector<std::string> flags;  // --env values
};

// Everything above merged; missing .dstrain_env files are skipped silently.
EnvList collect_remote_env(const RemoteEnvSources& sources);

// `env` split by core/secrets.h's rules: what may go on the remote command line, and the secrets,
// which go on the SSH channel (stdin_env.h). Each secret's value is learnt for redaction.
struct SplitEnv {
  EnvList exported;
  EnvList secret;
};
SplitEnv split_secret_env(const EnvList& env);

}  // namespace dstrain::launcher
