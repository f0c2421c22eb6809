#include "hub/model_files.h"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace dstrain::hub {
namespace stdfs = std::filesystem;
namespace {

const char* const kOptionalFiles[] = {"generation_config.json",
                                      "tokenizer.json",
                                      "tokenizer_config.json",
                                      "special_tokens_map.json",
                                      "added_tokens.json",
                                      "vocab.json",
                                      "merges.txt",
                                      "tokenizer.model",
                                      "chat_template.jinja",
                                      "encoder.json",
                                      "vocab.bpe"};

std::string listing(const std::vector<std::string>& files) {
  std::string s;
  for (size_t i = 0; i < files.size() && i < 20; ++i) s += (i ? ", " : "") + files[i];
  if (files.size() > 20) s += ", ...";
  return s.empty() ? "none" : s;
}

}  // namespace

std::vector<std::string> model_files(const std::vector<std::string>& repo_files, bool weights,
                                     const std::string& repo) {
  const std::set<std::string> have(repo_files.begin(), repo_files.end());
  if (!have.count(kConfigFile))
    fail(ErrorKind::kInput,
         "model '{}' has no config.json, so it is not a transformers model (its files: {})", repo,
         listing(repo_files));
  std::vector<std::string> out = {kConfigFile};
  for (const char* f : kOptionalFiles)
    if (have.count(f)) out.push_back(f);
  if (!weights) return out;
  if (have.count(kWeightsIndexFile))
    out.push_back(kWeightsIndexFile);
  else if (have.count(kWeightsFile))
    out.push_back(kWeightsFile);
  else
    fail(ErrorKind::kInput,
         "model '{}' has no safetensors weights (model.safetensors or "
         "model.safetensors.index.json); dstrain reads only safetensors (its files: {})",
         repo, listing(repo_files));
  return out;
}

std::vector<std::string> index_shards(const stdfs::path& index_file) {
  std::set<std::string> shards;
  try {
    const auto j = nlohmann::json::parse(fs::read_file(index_file));
    for (const auto& [tensor, file] : j.at("weight_map").items())
      shards.insert(file.get<std::string>());
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInput, "{}: not a safetensors index (a weight_map of tensor → file): {}",
         index_file.string(), e.what());
  }
  if (shards.empty())
    fail(ErrorKind::kInput, "{}: the weight_map names no file", index_file.string());
  return {shards.begin(), shards.end()};
}

std::vector<std::string> missing_model_files(const stdfs::path& dir, bool weights) {
  std::vector<std::string> missing;
  if (!stdfs::exists(dir / kConfigFile)) missing.push_back(kConfigFile);
  if (!weights) return missing;
  if (stdfs::exists(dir / kWeightsIndexFile)) {
    for (const auto& shard : index_shards(dir / kWeightsIndexFile))
      if (!stdfs::exists(dir / shard)) missing.push_back(shard);
  } else if (!stdfs::exists(dir / kWeightsFile)) {
    missing.push_back(std::string(kWeightsFile) + " (or " + kWeightsIndexFile + ")");
  }
  return missing;
}

}  // namespace dstrain::hub
