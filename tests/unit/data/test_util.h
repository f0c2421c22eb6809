#pragma once
// Shared helpers for the data tests: a byte tokenizer (ids 0..255 = bytes, 256 = eos, 257 = pad)
// that implements the Tokenizer interface, and a per-test temporary directory with real files.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/common/expect_error.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::data::testing {

namespace stdfs = std::filesystem;

class BytesTokenizer : public tokenizer::Tokenizer {
 public:
  static constexpr int32_t kEos = 256;
  static constexpr int32_t kPad = 257;
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id < 256) s.push_back(static_cast<char>(id));
    }
    return s;
  }
  int64_t vocab_size() const override { return 258; }
  std::optional<int32_t> eos_id() const override { return kEos; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::optional<int32_t> pad_id() const override { return kPad; }
};

// A fresh directory under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = stdfs::temp_directory_path() / ("dstrain_data_" + std::to_string(::getpid()) + "_" +
                                            info->test_suite_name() + "_" + info->name());
    stdfs::remove_all(path_);
    stdfs::create_directories(path_);
  }
  ~TempDir() { stdfs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& bytes) const {
    const stdfs::path p = path_ / name;
    stdfs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }
  std::string path(const std::string& name = "") const { return (path_ / name).string(); }

 private:
  stdfs::path path_;
};

using ::dstrain::testing::expect_error;

// Tokens of a corpus document as a vector (for comparisons).
inline std::vector<int32_t> ids(const std::string& text) {
  return BytesTokenizer().encode(text);
}

}  // namespace dstrain::data::testing
