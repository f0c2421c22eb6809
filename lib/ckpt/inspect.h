#pragma once
// What `dstrain ckpt verify` and `dstrain ckpt inspect` report about a checkpoint: whether every
// file the manifest lists is there with its recorded size and crc32, what the checkpoint holds
// (step, world, stage, sizes), and how its run config differs from a given one.
//
// Verification reads every listed file once, sequentially, whatever the world size; nothing is
// written. A checkpoint verifies when every listed file exists with the recorded size and crc32;
// files in the tag directory that the manifest does not list are reported but do not fail it.

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/manifest.h"

namespace dstrain::ckpt {

struct FileCheck {
  std::string name;
  int64_t bytes = 0;          // recorded in the manifest
  int64_t actual_bytes = -1;  // -1: missing
  std::string crc32;          // recorded
  std::string actual_crc32;   // empty when missing or when the size already differs
  bool ok() const { return actual_bytes == bytes && actual_crc32 == crc32; }
  std::string problem() const;  // "" when ok, else e.g. "missing", "size 10, expected 12"
};

struct VerifyReport {
  std::string tag_dir;
  std::vector<FileCheck> files;       // in manifest order
  std::vector<std::string> unlisted;  // files in the tag directory the manifest does not name
  bool ok() const;
};

// `path` as resolve_checkpoint() takes it (a tag directory, <dir>/latest, or a directory holding
// `latest`). Error(kInput) when it does not name a complete checkpoint or its manifest is
// malformed; a file that fails verification is reported, not thrown.
VerifyReport verify_checkpoint(const std::string& path);

// One differing setting of the run config: the key path and the value in each, as
// config::flatten writes them ("<unset>" when a side lacks the key).
struct ConfigDifference {
  std::string key;
  std::string checkpoint;
  std::string given;
};

// Settings of the checkpoint's saved config that differ from the config at `config_path` (loaded
// and resolved as `dstrain train` would, with `overrides`). Error(kConfig) for a bad config.
std::vector<ConfigDifference> config_differences(const Manifest& manifest,
                                                 const std::string& config_path,
                                                 const std::vector<std::string>& overrides);

// The human-readable report of `dstrain ckpt inspect`: the manifest's step, world size, ZeRO stage,
// dtype, model, tokens and loss, each file with its size and verification result, the total size,
// and (when `config_path` is not empty) the config differences.
std::string inspect_report(const std::string& path, const std::string& config_path,
                           const std::vector<std::string>& overrides);

}  // namespace dstrain::ckpt
