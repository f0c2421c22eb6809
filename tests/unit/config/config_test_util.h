#pragma once
// Helpers for the config tests: temp directories with real files, and expecting a config error
// whose message contains given pieces.

#include <filesystem>
#include <initializer_list>
#include <string>

#include "config/config.h"

namespace dstrain::config::testing {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  // Writes `text` to path()/name and returns the full path.
  std::string write(const std::string& name, const std::string& text) const;

 private:
  std::filesystem::path path_;
};

// A minimal valid config (model + data) followed by `extra`.
std::string minimal_yaml(const std::string& extra = "");

// The message of the Error(kConfig) that loading `yaml` throws, "" (and a test failure) if none.
std::string load_error(const std::string& yaml, const LoadOptions& options = {},
                       const std::string& name = "train.yaml");

// Load options for a job of `n` ranks.
LoadOptions world(int n);

std::string seed_dir();  // DSTRAIN_SOURCE_DIR/../shared/seed-configs

}  // namespace dstrain::config::testing
