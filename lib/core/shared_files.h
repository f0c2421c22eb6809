#pragma once
// Names of files that modules which cannot link each other read and write alike, in one place:
// a Hugging Face model directory's config.json (model, hub, ckpt, the export), and a checkpoint
// directory's `latest` (ckpt writes it; the launcher's --resume-latest and restarts read it
// without LibTorch, so not through ckpt).

#include <optional>
#include <string>

namespace dstrain::shared_files {

// <model dir>/config.json: the model's Hugging Face configuration.
inline constexpr const char* kModelConfig = "config.json";
// <checkpoint dir>/latest: the tag of the newest complete checkpoint, and a newline.
inline constexpr const char* kLatest = "latest";

// Writes <dir>/latest = tag atomically (temp + fsync + rename + fsync dir).
void write_latest(const std::string& dir, const std::string& tag);
// The tag in <dir>/latest (trailing white space dropped), or nullopt when there is none.
std::optional<std::string> read_latest(const std::string& dir);

}  // namespace dstrain::shared_files
