#pragma once
// Expecting a dstrain::Error of a given kind whose message names given things (header-only, no
// LibTorch).

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dstrain::testing {

// Runs `fn`, expecting Error(kind) whose message contains every string of `parts`; a failure of
// the current test otherwise (no error, another kind, or a part missing from the message).
template <typename Fn>
void expect_error(Fn&& fn, ErrorKind kind, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const auto& p : parts) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message \"" << e.what() << "\" lacks \"" << p << "\"";
    }
  }
}

}  // namespace dstrain::testing
