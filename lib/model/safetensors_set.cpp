// SafetensorsSet: a model directory's tensors, from model.safetensors or a sharded index.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "model/safetensors.h"

namespace dstrain::model {
namespace stdfs = std::filesystem;
using nlohmann::json;

namespace {

json read_index(const stdfs::path& index) {
  json doc;
  try {
    doc = json::parse(fs::read_file(index));
  } catch (const json::parse_error& e) {
    fail(ErrorKind::kInput, "{}: invalid JSON: {}", index.string(), e.what());
  }
  if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object())
    fail(ErrorKind::kInput, "{}: expected an object with a 'weight_map' object", index.string());
  return doc;
}

// Shard names must be plain file names in the same directory.
void check_shard_name(const stdfs::path& index, const std::string& tensor, const json& file) {
  if (!file.is_string())
    fail(ErrorKind::kInput, "{}: weight_map entry '{}' must name a file", index.string(), tensor);
  const std::string f = file.get<std::string>();
  if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos)
    fail(ErrorKind::kInput,
         "{}: weight_map entry '{}' names '{}'; expected a file name in the same "
         "directory",
         index.string(), tensor, f);
}

}  // namespace

bool SafetensorsSet::present_in(const stdfs::path& dir) {
  return stdfs::exists(dir / kSafetensorsIndexFile) || stdfs::exists(dir / kSafetensorsFile);
}

SafetensorsSet::SafetensorsSet(const stdfs::path& dir) : dir_(dir) {
  if (stdfs::exists(dir / kSafetensorsIndexFile)) {
    open_index(dir / kSafetensorsIndexFile);
    return;
  }
  if (!stdfs::exists(dir / kSafetensorsFile))
    fail(ErrorKind::kInput, "{}: no {} or {} (only safetensors weights are supported)",
         dir.string(), kSafetensorsFile, kSafetensorsIndexFile);
  files_.push_back(std::make_unique<SafetensorsFile>(dir / kSafetensorsFile));
  for (const std::string& name : files_.back()->names()) owner_[name] = files_.back().get();
}

void SafetensorsSet::open_index(const stdfs::path& index) {
  const json doc = read_index(index);
  std::map<std::string, const SafetensorsFile*> by_file;
  for (const auto& [tensor, file] : doc["weight_map"].items()) {
    check_shard_name(index, tensor, file);
    const std::string f = file.get<std::string>();
    if (by_file.count(f) == 0) {
      if (!stdfs::exists(dir_ / f))
        fail(ErrorKind::kInput, "{}: shard '{}' (holding '{}') does not exist", index.string(), f,
             tensor);
      files_.push_back(std::make_unique<SafetensorsFile>(dir_ / f));
      by_file[f] = files_.back().get();
    }
    const SafetensorsFile* shard = by_file[f];
    if (!shard->contains(tensor))
      fail(ErrorKind::kInput, "{}: weight_map puts '{}' in '{}', which has no such tensor",
           index.string(), tensor, f);
    owner_[tensor] = shard;
  }
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : owner_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsSet::file_of(const std::string& name) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) fail(ErrorKind::kInput, "{}: no tensor named '{}'", dir_.string(), name);
  return *it->second;
}

}  // namespace dstrain::model
