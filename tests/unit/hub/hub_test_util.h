#pragma once
// Helpers of the hub tests: a self-deleting temporary directory, an environment variable set for a
// test's lifetime, files written in one call, and a check on an Error's kind and message.

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/common/expect_error.h"
#include "tests/common/temp_dir.h"

namespace dstrain::hub::testing {

using dstrain::testing::TempDir;

// Sets (or, with nullptr, unsets) an environment variable until the end of the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = std::string(old);
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

inline void write(const std::filesystem::path& p, const std::string& text = "{}") {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

inline std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

using ::dstrain::testing::expect_error;

}  // namespace dstrain::hub::testing
