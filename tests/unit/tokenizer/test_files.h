#pragma once
// Shared helpers for the tokenizer tests: paths of the real tokenizer files, scratch directories
// and a tiny byte-level vocabulary for error-case fixtures.

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace dstrain::tokenizer::testing {

namespace stdfs = std::filesystem;

// <shared>/data/<rel>: $DSTRAIN_SHARED_DIR, else the shared/ folder beside the source tree.
stdfs::path shared_data(const std::string& rel);

// Skips the current test (from the test body) when `path` is absent.
#define DSTRAIN_SKIP_IF_MISSING(path) \
  if (!std::filesystem::exists(path)) \
  GTEST_SKIP() << "shared test data not found: " << (path).string()

// A fresh directory, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const stdfs::path& path() const { return path_; }
  void write(const std::string& name, const std::string& content) const;

 private:
  stdfs::path path_;
};

// {byte symbol: byte} for all 256 bytes plus `extra` tokens with ids 256, 257, ...
nlohmann::json byte_vocab(const std::vector<std::string>& extra = {});

// Strings that are hard for byte-level BPE; all in NFC so they round-trip through NFC tokenizers.
const std::vector<std::string>& hard_strings();

// Reads a whole file.
std::string read_text(const stdfs::path& path);

}  // namespace dstrain::tokenizer::testing
