#pragma once
// Where a model named in a run config lives on disk.
//
// `name_or_path` is either a local directory holding config.json (and weights), or a Hugging Face
// hub id
// (`Org/Name`, or a bare `Name`) already present in the local Hugging Face cache. The cache root is
// $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub, laid out as
//   models--Org--Name/refs/main            (text: the commit of the main branch)
//   models--Org--Name/snapshots/<commit>/  (config.json, *.safetensors, tokenizer files)
// The snapshot named by refs/main is preferred; without it, the most recently modified snapshot
// that holds a config.json is used. Downloading is not done here.

#include <filesystem>
#include <string>

namespace dstrain::model {

// The Hugging Face hub cache root from the environment (the path need not exist).
std::filesystem::path hf_hub_cache_dir();

// Resolves `name_or_path` to a directory containing config.json. Error(kInput) when it is neither a
// directory with config.json nor a cached hub id; the message says which paths were looked at.
std::filesystem::path resolve_model_dir(const std::string& name_or_path);

}  // namespace dstrain::model
