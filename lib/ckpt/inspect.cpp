#include "ckpt/inspect.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "ckpt/layout.h"
#include "ckpt/shards.h"
#include "config/config.h"
#include "core/bytes.h"
#include "core/error.h"
#include "core/fs.h"

namespace dstrain::ckpt {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

FileCheck check_file(const stdfs::path& dir, const FileRecord& record) {
  FileCheck c;
  c.name = record.name;
  c.bytes = record.bytes;
  c.crc32 = record.crc32;
  const stdfs::path p = dir / c.name;
  std::error_code ec;
  if (!stdfs::is_regular_file(p, ec)) return c;
  c.actual_bytes = static_cast<int64_t>(stdfs::file_size(p, ec));
  if (c.actual_bytes == c.bytes) c.actual_crc32 = file_crc32(p.string());
  return c;
}

// A component's state value as text, "-" when absent.
std::string state_value(const Manifest& m, const char* component, const char* key) {
  const ComponentRecord* c = m.component(component);
  if (c == nullptr || !c->state.contains(key)) return "-";
  return c->state[key].dump();
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
  const Manifest m = read_manifest(report.tag_dir);
  std::set<std::string> listed{kManifestFile};
  for (const FileRecord& entry : m.files) {
    report.files.push_back(check_file(report.tag_dir, entry));
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

std::vector<ConfigDifference> config_differences(const Manifest& manifest,
                                                 const std::string& config_path,
                                                 const std::vector<std::string>& overrides) {
  if (manifest.config_yaml.empty()) {
    fail(ErrorKind::kInput, "the checkpoint's manifest has no saved config to compare with");
  }
  // Both at the checkpoint's world size, which the saved config was valid for (its
  // sequence_parallel_size divides it).
  config::LoadOptions saved_load;
  saved_load.world_size = manifest.world_size;
  const config::Config saved = config::load_config_from_string(
      manifest.config_yaml, "the checkpoint's config.yaml", saved_load);
  config::LoadOptions load;
  load.world_size = manifest.world_size;
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
  const Manifest m = read_manifest(v.tag_dir);
  std::string out = fmt::format("checkpoint {}\n", v.tag_dir);
  out += fmt::format(
      "  step {}  world size {}  zero stage {}  dtype {}  optimizer steps {}\n"
      "  tokens seen {}  train loss {}\n",
      m.step, m.world_size, m.zero_stage, m.compute_dtype,
      state_value(m, "engine", "optimizer_steps"), state_value(m, "progress", "tokens_seen"),
      m.train_loss);
  if (!m.model_name_or_path.empty()) out += fmt::format("  model {}\n", m.model_name_or_path);
  std::string states;
  for (const auto& [name, rec] : m.components)
    states += fmt::format(" {} (v{})", name, rec.version);
  if (!states.empty()) out += "  state:" + states + "\n";
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
