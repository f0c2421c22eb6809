#include "core/shared_files.h"

#include <cctype>
#include <filesystem>
#include <system_error>

#include "core/fs.h"

namespace dstrain::shared_files {

void write_latest(const std::string& dir, const std::string& tag) {
  fs::write_file_atomic(std::filesystem::path(dir) / kLatest, tag + "\n");
}

std::optional<std::string> read_latest(const std::string& dir) {
  const std::filesystem::path p = std::filesystem::path(dir) / kLatest;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return std::nullopt;
  std::string tag = fs::read_file(p);
  while (!tag.empty() && std::isspace(static_cast<unsigned char>(tag.back()))) tag.pop_back();
  return tag;
}

}  // namespace dstrain::shared_files
