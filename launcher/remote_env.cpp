#include "launcher/remote_env.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/secrets.h"
#include "launcher/text_util.h"

namespace dstrain::launcher {

const char* const kForwardedPrefixes[] = {"NCCL_", "GLOO_", "DSTRAIN_", "MLFLOW_", "WANDB_", "HF_",
                                          "CUDA_", "OMP_",  "UCX_",     "FI_",     nullptr};

bool is_env_name(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

EnvList forwarded_variables(const char* const* environ) {
  EnvList out;
  for (const char* const* e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry = *e;
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    std::string name = entry.substr(0, eq);
    bool forwarded = false;
    for (const char* const* p = kForwardedPrefixes; *p != nullptr; ++p) {
      forwarded = forwarded || name.rfind(*p, 0) == 0;
    }
    if (forwarded && is_env_name(name)) out.emplace_back(name, entry.substr(eq + 1));
  }
  std::sort(out.begin(), out.end());
  return out;
}

EnvList parse_env_file(const std::string& text, const std::string& path) {
  EnvList out;
  std::istringstream in(text);
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    if (!raw.empty() && raw.back() == '\r') raw.pop_back();
    size_t start = raw.find_first_not_of(" \t");
    if (start == std::string::npos || raw[start] == '#') continue;  // blank or comment line
    size_t eq = raw.find('=', start);
    std::string name = eq == std::string::npos ? "" : raw.substr(start, eq - start);
    if (!is_env_name(name)) {
      fail(ErrorKind::kInput, "{}:{}: expected KEY=VALUE with KEY a variable name, got '{}'", path,
           line, raw);
    }
    set_env(out, name, raw.substr(eq + 1));
  }
  return out;
}

std::pair<std::string, std::string> parse_env_flag(const std::string& text) {
  size_t eq = text.find('=');
  std::string name = text.substr(0, eq);
  if (eq == std::string::npos || !is_env_name(name)) {
    fail(ErrorKind::kUsage, "--env expects KEY=VALUE with KEY a variable name, got '{}'", text);
  }
  return {name, text.substr(eq + 1)};
}

void set_env(EnvList& env, const std::string& name, const std::string& value) {
  for (auto& kv : env) {
    if (kv.first == name) {
      kv.second = value;
      return;
    }
  }
  env.emplace_back(name, value);
}

EnvList collect_remote_env(const RemoteEnvSources& sources) {
  EnvList env = forwarded_variables(sources.environ);
  for (const std::string& name : sources.named) {
    for (const char* const* e = sources.environ; e != nullptr && *e != nullptr; ++e) {
      if (std::strncmp(*e, name.c_str(), name.size()) == 0 && (*e)[name.size()] == '=')
        set_env(env, name, *e + name.size() + 1);
    }
  }
  for (const std::string& dir : {sources.home, sources.cwd}) {
    if (dir.empty()) continue;
    std::string path = dir + "/.dstrain_env";
    if (!std::filesystem::is_regular_file(path)) continue;
    for (const auto& kv : parse_env_file(read_text_file(path, "env file"), path)) {
      set_env(env, kv.first, kv.second);
    }
  }
  for (const std::string& flag : sources.flags) {
    auto kv = parse_env_flag(flag);
    set_env(env, kv.first, kv.second);
  }
  return env;
}

SplitEnv split_secret_env(const EnvList& env) {
  SplitEnv split;
  for (const auto& kv : env) {
    if (!secrets::is_secret_name(kv.first)) {
      split.exported.push_back(kv);
      continue;
    }
    secrets::add_secret_value(kv.second);
    split.secret.push_back(kv);
  }
  return split;
}

}  // namespace dstrain::launcher
