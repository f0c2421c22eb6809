#include "hub/settings.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace dstrain::hub {
namespace stdfs = std::filesystem;
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// "~" and "~/..." as the shell would expand them (huggingface_hub calls expanduser).
stdfs::path expand_user(const std::string& p) {
  if (p == "~" || p.rfind("~/", 0) == 0) {
    const std::string home = env("HOME");
    return stdfs::path(home.empty() ? "/" : home) / p.substr(std::min<size_t>(2, p.size()));
  }
  return p;
}

bool is_true(const std::string& v) {
  std::string u = v;
  std::transform(u.begin(), u.end(), u.begin(), [](unsigned char c) { return std::toupper(c); });
  return u == "1" || u == "ON" || u == "YES" || u == "TRUE";
}

std::string clean_token(std::string t) {
  t.erase(std::remove(t.begin(), t.end(), '\r'), t.end());
  t.erase(std::remove(t.begin(), t.end(), '\n'), t.end());
  const auto first = t.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  return t.substr(first, t.find_last_not_of(" \t") - first + 1);
}

int timeout_from_env(const char* name, int fallback) {
  const std::string v = env(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (*end != '\0' || n <= 0 || n > 86400)
    fail(ErrorKind::kConfig,
         "environment variable {}='{}': expected a number of seconds (1..86400)", name, v);
  return static_cast<int>(n);
}

void read_token(HubSettings& s) {
  for (const char* name : {"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}) {
    s.token = clean_token(env(name));
    if (!s.token.empty()) {
      s.token_source = name;
      return;
    }
  }
  const std::string path_env = env("HF_TOKEN_PATH");
  const stdfs::path file = path_env.empty() ? hf_home() / "token" : expand_user(path_env);
  std::ifstream in(file);
  if (!in) return;
  std::ostringstream text;
  text << in.rdbuf();
  s.token = clean_token(text.str());
  if (!s.token.empty()) s.token_source = file.string();
}

}  // namespace

stdfs::path hf_home() {
  if (!env("HF_HOME").empty()) return expand_user(env("HF_HOME"));
  if (!env("XDG_CACHE_HOME").empty()) return expand_user(env("XDG_CACHE_HOME")) / "huggingface";
  return expand_user("~/.cache/huggingface");
}

stdfs::path hub_cache_dir() {
  if (!env("HF_HUB_CACHE").empty()) return expand_user(env("HF_HUB_CACHE"));
  if (!env("HUGGINGFACE_HUB_CACHE").empty()) return expand_user(env("HUGGINGFACE_HUB_CACHE"));
  return hf_home() / "hub";
}

HubSettings settings_from_env() {
  HubSettings s;
  std::string endpoint = env("HF_ENDPOINT");
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (!endpoint.empty()) s.endpoint = endpoint;
  s.cache_dir = hub_cache_dir();
  read_token(s);
  const std::string offline = env("HF_HUB_OFFLINE");
  s.offline = is_true(offline.empty() ? env("TRANSFORMERS_OFFLINE") : offline);
  s.metadata_timeout_s = timeout_from_env("HF_HUB_ETAG_TIMEOUT", s.metadata_timeout_s);
  s.download_timeout_s = timeout_from_env("HF_HUB_DOWNLOAD_TIMEOUT", s.download_timeout_s);
  return s;
}

}  // namespace dstrain::hub
