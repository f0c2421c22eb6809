#include "core/error.h"

#include <gtest/gtest.h>

namespace dstrain {
namespace {

TEST(Error, BadInputKindsExitWithTwo) {
  EXPECT_EQ(exit_code(ErrorKind::kUsage), 2);
  EXPECT_EQ(exit_code(ErrorKind::kConfig), 2);
  EXPECT_EQ(exit_code(ErrorKind::kInput), 2);
  EXPECT_EQ(exit_code(ErrorKind::kIo), 1);
  EXPECT_EQ(exit_code(ErrorKind::kRuntime), 1);
}

TEST(Error, FailFormatsMessageAndKeepsKind) {
  try {
    fail(ErrorKind::kConfig, "{}:{}: training.lr: expected a positive number", "a.yaml", 3);
    FAIL() << "fail() returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_STREQ(e.what(), "a.yaml:3: training.lr: expected a positive number");
  }
}

}  // namespace
}  // namespace dstrain
