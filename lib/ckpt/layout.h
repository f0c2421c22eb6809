#pragma once
// Every checkpoint file name is built and parsed here, and nowhere else.
//
//   <dir>/latest                        text: the tag of the newest complete checkpoint (atomic
//   replace) <dir>/<tag>/                        tag = "step_%08d"
//   <dir>/<tag>/shard_r%05d.safetensors one per rank, written by that rank
//   <dir>/<tag>/shard_r%05d.json        that rank's done record: size and checksum of its shard,
//                                       written after the shard is durable
//   <dir>/<tag>/shard_r%05d.error       instead, when that rank's write failed: the reason
//   <dir>/<tag>/manifest.json           written by rank 0 after every rank finished; a tag
//   directory
//                                       without a manifest is incomplete and is never loaded
//
// A checkpoint is complete exactly when its manifest exists; `latest` is replaced only after that.
// Beside them, <dir>/launch.json says how the job was launched; the launcher writes it and
// `dstrain resume` reads it (launcher/launch_record.h: the launcher cannot depend on this module).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/shared_files.h"

namespace dstrain::ckpt {

std::string tag_for_step(int64_t step);
// The step of a tag made by tag_for_step, or nullopt for any other name.
std::optional<int64_t> step_of_tag(const std::string& tag);

std::string shard_file_name(int rank);
std::string shard_state_file_name(int rank);
std::string shard_error_file_name(int rank);
inline constexpr const char* kManifestFile = "manifest.json";
inline constexpr const char* kLatestFile = shared_files::kLatest;
inline constexpr const char* kModelConfigFile = shared_files::kModelConfig;
inline constexpr const char* kRunConfigFile = "config.yaml";

// Tokenizer files a checkpoint carries over from the model directory, so that an export of it is
// a complete Hugging Face model directory.
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.json",
                                                  "tokenizer_config.json",
                                                  "vocab.json",
                                                  "merges.txt",
                                                  "added_tokens.json",
                                                  "special_tokens_map.json",
                                                  "generation_config.json"};

// <dir>/latest (core/shared_files.h: the launcher reads it too).
using shared_files::read_latest;
using shared_files::write_latest;

// Rank 0, before the ranks write a save of `tag`: makes <dir>/<tag> an empty directory. The
// directory may hold an older run's checkpoint of the same step; if `latest` names it, `latest`
// first moves to the newest other complete checkpoint (or is removed), so that `latest` never
// names an incomplete checkpoint, even if this save is interrupted.
void prepare_tag_dir(const std::string& dir, const std::string& tag);

// Resolves what a user gives on the command line to a complete tag directory:
//   <dir>/latest (the file) → the tag it names;  <dir> holding a `latest` file → same;
//   a tag directory → itself. Error(kInput) naming the path and what was expected otherwise, or
//   when the tag directory has no manifest (an interrupted save).
std::string resolve_checkpoint(const std::string& path);

// Complete tags under `dir` (those with a manifest), oldest first by step.
std::vector<std::string> list_complete_tags(const std::string& dir);

// Deletes complete checkpoints beyond the newest `keep_last` (0 = keep all), never `protect_tag`,
// and any incomplete tag directory older than the newest complete one (left by a crash).
void prune(const std::string& dir, int64_t keep_last, const std::string& protect_tag);

}  // namespace dstrain::ckpt
