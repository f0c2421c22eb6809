#include "model/hub.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "core/error.h"

namespace dstrain::model {
namespace stdfs = std::filesystem;
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// A hub id: one or two non-empty path parts of [A-Za-z0-9._-], not starting with '.' or '-'.
bool looks_like_hub_id(const std::string& s) {
  if (s.empty() || s.front() == '/' || s.back() == '/') return false;
  int slashes = 0;
  bool part_start = true;
  for (char ch : s) {
    if (ch == '/') {
      if (part_start) return false;
      ++slashes;
      part_start = true;
      continue;
    }
    const bool ok =
        std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
    if (!ok || (part_start && (ch == '.' || ch == '-'))) return false;
    part_start = false;
  }
  return slashes <= 1;
}

std::string read_ref(const stdfs::path& file) {
  std::ifstream in(file);
  std::string rev;
  in >> rev;
  return rev;
}

std::optional<stdfs::path> newest_snapshot(const stdfs::path& snapshots) {
  std::optional<stdfs::path> best;
  stdfs::file_time_type best_time{};
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(snapshots, ec)) {
    if (!stdfs::exists(e.path() / "config.json")) continue;
    const auto t = stdfs::last_write_time(e.path(), ec);
    if (!best || t > best_time) best = e.path(), best_time = t;
  }
  return best;
}

std::optional<stdfs::path> find_in_cache(const stdfs::path& repo) {
  const stdfs::path snapshots = repo / "snapshots";
  if (!stdfs::is_directory(snapshots)) return std::nullopt;
  const std::string rev = read_ref(repo / "refs" / "main");
  if (!rev.empty() && stdfs::exists(snapshots / rev / "config.json")) return snapshots / rev;
  return newest_snapshot(snapshots);
}

}  // namespace

stdfs::path hf_hub_cache_dir() {
  if (!env("HF_HUB_CACHE").empty()) return env("HF_HUB_CACHE");
  if (!env("HF_HOME").empty()) return stdfs::path(env("HF_HOME")) / "hub";
  const std::string home = env("HOME");
  return stdfs::path(home.empty() ? "/" : home) / ".cache" / "huggingface" / "hub";
}

stdfs::path resolve_model_dir(const std::string& name_or_path) {
  if (name_or_path.empty()) fail(ErrorKind::kInput, "model name_or_path is empty");
  const stdfs::path local(name_or_path);
  if (stdfs::is_directory(local)) {
    if (!stdfs::exists(local / "config.json"))
      fail(ErrorKind::kInput, "model directory {} has no config.json", local.string());
    return local;
  }
  if (!looks_like_hub_id(name_or_path))
    fail(ErrorKind::kInput, "model '{}': no such directory, and not a hub id of the form Org/Name",
         name_or_path);
  std::string folder = "models--" + name_or_path;
  for (size_t p = folder.find('/'); p != std::string::npos; p = folder.find('/'))
    folder.replace(p, 1, "--");
  const stdfs::path repo = hf_hub_cache_dir() / folder;
  if (auto dir = find_in_cache(repo)) return *dir;
  fail(ErrorKind::kInput,
       "model '{}' is neither a local directory nor in the Hugging Face cache: looked for a "
       "snapshot "
       "with config.json under {} (cache root from HF_HUB_CACHE, else HF_HOME/hub, else "
       "~/.cache/huggingface/hub); downloading is not supported, fetch it first (e.g. "
       "`huggingface-cli download {}`)",
       name_or_path, (repo / "snapshots").string(), name_or_path);
}

}  // namespace dstrain::model
