#include "ckpt/inspect.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "ckpt/layout.h"
#include "ckpt/shards.h"
#include "config/config.h"
#include "core/error.h"
#include "core/fs.h"

namespace dstrain::ckpt {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

json read_manifest(const std::string& tag_dir) {
  const std::string path = (stdfs::path(tag_dir) / kManifestFile).string();
  json m;
  try {
    m = json::parse(fs::read_file(path));
  } catch (const json::exception& e) {
    fail(ErrorKind::kInput, "{}: not valid JSON: {}", path, e.what());
  }
  if (!m.is_object() || !m.contains("files") || !m["files"].is_array()) {
    fail(ErrorKind::kInput, "{}: expected an object with a \"files\" list", path);
  }
  return m;
}

FileCheck check_file(const stdfs::path& dir, const json& entry, const std::string& manifest) {
  FileCheck c;
  try {
    c.name = entry.at("name").get<std::string>();
    c.bytes = entry.at("bytes").get<int64_t>();
    c.crc32 = entry.at("crc32").get<std::string>();
  } catch (const json::exception&) {
    fail(ErrorKind::kInput, "{}: a \"files\" entry lacks name, bytes or crc32: {}", manifest,
         entry.dump());
  }
  const stdfs::path p = dir / c.name;
  std::error_code ec;
  if (!stdfs::is_regular_file(p, ec)) return c;
  c.actual_bytes = static_cast<int64_t>(stdfs::file_size(p, ec));
  if (c.actual_bytes == c.bytes) c.actual_crc32 = file_crc32(p.string());
  return c;
}

std::string human_bytes(int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.2f} {}", v, units[u]);
}

std::string value_or(const json& m, const char* key) {
  if (!m.contains(key)) return "-";
  const json& v = m[key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

}  // namespace

std::string FileCheck::problem() const {
  if (actual_bytes < 0) return "missing";
  if (actual_bytes != bytes) return fmt::format("size {}, expected {}", actual_bytes, bytes);
  if (actual_crc32 != crc32) return fmt::format("crc32 {}, expected {}", actual_crc32, crc32);
  return "";
}

bool VerifyReport::ok() const {
  return std::all_of(files.begin(), files.end(), [](const FileCheck& f) { return f.ok(); });
}

VerifyReport verify_checkpoint(const std::string& path) {
  VerifyReport report;
  report.tag_dir = resolve_checkpoint(path);
  const json m = read_manifest(report.tag_dir);
  const std::string manifest_path = (stdfs::path(report.tag_dir) / kManifestFile).string();
  std::set<std::string> listed{kManifestFile};
  for (const json& entry : m["files"]) {
    report.files.push_back(check_file(report.tag_dir, entry, manifest_path));
    listed.insert(report.files.back().name);
  }
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(report.tag_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!listed.count(name)) report.unlisted.push_back(name);
  }
  std::sort(report.unlisted.begin(), report.unlisted.end());
  return report;
}

std::vector<ConfigDifference> config_differences(const json& manifest,
                                                 const std::string& config_path,
                                                 const std::vector<std::string>& overrides) {
  if (!manifest.contains("config") || !manifest["config"].is_string()) {
    fail(ErrorKind::kInput, "the checkpoint's manifest has no saved config to compare with");
  }
  const config::Config saved = config::load_config_from_string(
      manifest["config"].get<std::string>(), "the checkpoint's config.yaml");
  config::LoadOptions load;
  load.overrides = overrides;
  const config::Config given = config::load_config(config_path, load);
  std::map<std::string, std::string> a;
  std::map<std::string, std::string> b;
  for (const config::FlatSetting& s : config::flatten(saved)) a[s.key] = s.text;
  for (const config::FlatSetting& s : config::flatten(given)) b[s.key] = s.text;
  std::vector<ConfigDifference> out;
  for (const auto& [key, text] : a) {
    const auto it = b.find(key);
    const std::string other = it == b.end() ? "<unset>" : it->second;
    if (other != text) out.push_back({key, text, other});
  }
  for (const auto& [key, text] : b) {
    if (!a.count(key)) out.push_back({key, "<unset>", text});
  }
  return out;
}

std::string inspect_report(const std::string& path, const std::string& config_path,
                           const std::vector<std::string>& overrides) {
  const VerifyReport v = verify_checkpoint(path);
  const json m = read_manifest(v.tag_dir);
  std::string out = fmt::format("checkpoint {}\n", v.tag_dir);
  out += fmt::format(
      "  step {}  world size {}  zero stage {}  dtype {}  optimizer steps {}\n"
      "  tokens seen {}  train loss {}\n",
      value_or(m, "step"), value_or(m, "world_size"), value_or(m, "zero_stage"),
      value_or(m, "compute_dtype"), value_or(m, "optimizer_steps"), value_or(m, "tokens_seen"),
      value_or(m, "train_loss"));
  if (m.contains("model") && m["model"].is_object()) {
    out += fmt::format("  model {}\n", value_or(m["model"], "name_or_path"));
  }
  int64_t total = 0;
  size_t bad = 0;
  out += "  files:\n";
  for (const FileCheck& f : v.files) {
    total += f.bytes;
    bad += f.ok() ? 0 : 1;
    out += fmt::format("    {:<32} {:>12}  crc32 {}  {}\n", f.name, human_bytes(f.bytes), f.crc32,
                       f.ok() ? "ok" : f.problem());
  }
  for (const std::string& name : v.unlisted)
    out += fmt::format("    {:<32} (not in the manifest)\n", name);
  out += fmt::format(
      "  {} files, {}; {}\n", v.files.size(), human_bytes(total),
      bad == 0 ? "every checksum verified" : fmt::format("{} file(s) FAILED verification", bad));
  if (!config_path.empty()) {
    const auto diffs = config_differences(m, config_path, overrides);
    out += diffs.empty() ? fmt::format("  config: same as {}\n", config_path)
                         : fmt::format("  config differences (checkpoint → {}):\n", config_path);
    for (const ConfigDifference& d : diffs) {
      out += fmt::format("    {}: {} → {}\n", d.key, d.checkpoint, d.given);
    }
  }
  return out;
}

}  // namespace dstrain::ckpt
