#pragma once
// Which files of a hub repo make a model for dstrain, and whether a snapshot folder has them.
//
// Fetched: config.json; generation_config.json; the tokenizer files (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, added_tokens.json, vocab.json, merges.txt,
// tokenizer.model, chat_template.jinja, and GPT-2's encoder.json + vocab.bpe) that the repo has;
// and, when weights are wanted, the safetensors: model.safetensors.index.json and the shards its
// weight_map names, or else model.safetensors. Nothing else: no README, no .bin or .pth weights,
// no other *.safetensors (such as Mistral's consolidated.safetensors), nothing in subfolders.
//
// A snapshot is usable as a model when it holds config.json and, when weights are wanted, either
// the index and every shard it names, or model.safetensors (the same rule the weight loader uses).

#include <filesystem>
#include <string>
#include <vector>

#include "core/shared_files.h"

namespace dstrain::hub {

inline constexpr const char* kConfigFile = shared_files::kModelConfig;
inline constexpr const char* kWeightsFile = "model.safetensors";
inline constexpr const char* kWeightsIndexFile = "model.safetensors.index.json";

// The files to fetch from `repo_files` (the repo's listing), in order: config.json first, the
// weights (the index, not yet its shards) last. Error(kInput) naming `repo` when there is no
// config.json, or no safetensors weights while `weights` is set.
std::vector<std::string> model_files(const std::vector<std::string>& repo_files, bool weights,
                                     const std::string& repo);

// The shard files an index's weight_map names, sorted, each once. Error(kInput) naming the file
// when it is not such an index.
std::vector<std::string> index_shards(const std::filesystem::path& index_file);

// What `dir` lacks to be used as a model (see above); empty when nothing.
std::vector<std::string> missing_model_files(const std::filesystem::path& dir, bool weights);

}  // namespace dstrain::hub
