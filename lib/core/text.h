#pragma once
// Prefix and suffix tests of std::string (C++20's starts_with/ends_with, for C++17).

#include <string>

namespace dstrain {

inline bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

inline bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace dstrain
