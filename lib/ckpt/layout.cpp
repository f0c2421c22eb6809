#include "ckpt/layout.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"

namespace dstrain::ckpt {
namespace stdfs = std::filesystem;

std::string tag_for_step(int64_t step) {
  return fmt::format("step_{:08d}", step);
}

std::optional<int64_t> step_of_tag(const std::string& tag) {
  constexpr std::string_view kPrefix = "step_";
  if (tag.size() <= kPrefix.size() || tag.compare(0, kPrefix.size(), kPrefix) != 0) {
    return std::nullopt;
  }
  const std::string digits = tag.substr(kPrefix.size());
  if (digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); })) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

std::string shard_file_name(int rank) {
  return fmt::format("shard_r{:05d}.safetensors", rank);
}
std::string shard_state_file_name(int rank) {
  return fmt::format("shard_r{:05d}.json", rank);
}

std::string shard_error_file_name(int rank) {
  return fmt::format("shard_r{:05d}.error", rank);
}

namespace {

std::string complete_tag_dir(const stdfs::path& tag_dir, const std::string& given) {
  if (!stdfs::is_regular_file(tag_dir / kManifestFile)) {
    fail(ErrorKind::kInput,
         "{}: checkpoint {} has no {} (an interrupted save?); expected a complete checkpoint "
         "directory",
         given, tag_dir.string(), kManifestFile);
  }
  return tag_dir.string();
}

std::string tag_dir_from_latest(const stdfs::path& dir, const std::string& given) {
  const auto tag = read_latest(dir.string());
  if (!tag || tag->empty() || tag->find('/') != std::string::npos) {
    fail(ErrorKind::kInput, "{}: {}/latest does not name a checkpoint tag", given, dir.string());
  }
  return complete_tag_dir(dir / *tag, given);
}

}  // namespace

std::string resolve_checkpoint(const std::string& path) {
  const stdfs::path p(path);
  if (stdfs::is_regular_file(p) && p.filename() == kLatestFile) {
    return tag_dir_from_latest(p.parent_path().empty() ? stdfs::path(".") : p.parent_path(), path);
  }
  if (stdfs::is_directory(p)) {
    if (stdfs::is_regular_file(p / kManifestFile)) return p.string();
    if (stdfs::is_regular_file(p / kLatestFile)) return tag_dir_from_latest(p, path);
    return complete_tag_dir(p, path);
  }
  fail(ErrorKind::kInput,
       "{}: no such checkpoint; expected <dir>/latest, a checkpoint directory holding `latest`, or "
       "a tag directory such as <dir>/step_00000100",
       path);
}

std::vector<std::string> list_complete_tags(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto step = step_of_tag(name);
    if (step && stdfs::is_regular_file(e.path() / kManifestFile)) found.emplace_back(*step, name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> tags;
  for (auto& [step, name] : found) tags.push_back(name);
  return tags;
}

void prune(const std::string& dir, int64_t keep_last, const std::string& protect_tag) {
  const auto tags = list_complete_tags(dir);
  const int64_t newest_step = tags.empty() ? -1 : *step_of_tag(tags.back());
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const auto step = step_of_tag(name);
    if (!step || name == protect_tag) continue;
    const bool complete = stdfs::is_regular_file(e.path() / kManifestFile);
    bool remove = false;
    if (!complete) {
      remove = *step < newest_step;
    } else if (keep_last > 0) {
      const auto pos = std::find(tags.begin(), tags.end(), name) - tags.begin();
      remove = static_cast<int64_t>(tags.size()) - pos > keep_last;
    }
    if (remove) {
      stdfs::remove_all(e.path(), ec);
      if (ec) log::warn("could not remove old checkpoint {}: {}", e.path().string(), ec.message());
    }
  }
}

void prepare_tag_dir(const std::string& dir, const std::string& tag) {
  std::error_code ec;
  if (read_latest(dir) == tag) {
    auto tags = list_complete_tags(dir);
    tags.erase(std::remove(tags.begin(), tags.end(), tag), tags.end());
    if (tags.empty()) {
      stdfs::remove(stdfs::path(dir) / kLatestFile, ec);
    } else {
      write_latest(dir, tags.back());
    }
  }
  const stdfs::path tag_dir = stdfs::path(dir) / tag;
  stdfs::remove_all(tag_dir, ec);  // leftovers of a crashed save, or an older run's checkpoint
  fs::create_dirs(tag_dir);
}

}  // namespace dstrain::ckpt
