#include "tests/integration/shell_util.h"

#include <stdlib.h>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <stdexcept>

#include <gtest/gtest.h>

namespace dstrain::testing {

std::string shell_output(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

void shell_must(const std::string& command, const std::string& what) {
  const int rc = std::system((command + " >/dev/null 2>&1").c_str());
  if (rc != 0) {
    ADD_FAILURE() << "setup command failed (" << rc << "): " << command;
    throw std::runtime_error(what);
  }
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

std::string make_temp_dir(const std::string& prefix) {
  std::string pattern = std::filesystem::temp_directory_path().string() + "/" + prefix + "XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("cannot create a temporary directory " + pattern);
  }
  return pattern;
}

}  // namespace dstrain::testing
