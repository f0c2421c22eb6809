#include "config_test_util.h"

#include <cstdlib>
#include <fstream>
#include <random>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dstrain::config::testing {

TempDir::TempDir() {
  std::random_device rd;
  path_ = std::filesystem::temp_directory_path() / ("dstrain_config_test_" + std::to_string(rd()));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::write(const std::string& name, const std::string& text) const {
  const auto file = path_ / name;
  std::ofstream(file) << text;
  return file.string();
}

std::string minimal_yaml(const std::string& extra) {
  return "model:\n  name_or_path: tiny\ndata:\n  train_path: train.txt\n" + extra;
}

std::string load_error(const std::string& yaml, const LoadOptions& options,
                       const std::string& name) {
  try {
    load_config_from_string(yaml, name, options);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected a config error for:\n" << yaml;
  return "";
}

std::string seed_dir() {
  // DSTRAIN_SHARED_DIR lets a checkout that does not sit beside shared/ point at it.
  const char* shared = std::getenv("DSTRAIN_SHARED_DIR");
  return std::string(shared != nullptr ? shared : DSTRAIN_SOURCE_DIR "/../shared") +
         "/seed-configs";
}

LoadOptions world(int n) {
  LoadOptions options;
  options.world_size = n;
  return options;
}

}  // namespace dstrain::config::testing
