#include "launcher/program_path.h"

#include <unistd.h>
#include <cstdio>

#include <gtest/gtest.h>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

TEST(ProgramPath, SelfExecutableIsThisTestBinary) {
  std::string self = self_executable();
  ASSERT_FALSE(self.empty());
  EXPECT_EQ(self[0], '/');
  EXPECT_NE(self.find("launcher_test"), std::string::npos) << self;
}

TEST(ProgramPath, WorkerIsBesideThisExecutable) {
  std::string self = self_executable();
  EXPECT_EQ(worker_executable(), self.substr(0, self.rfind('/') + 1) + "dstrain-worker");
}

TEST(ProgramPath, FindsProgramsOnPath) {
  std::string sh = resolve_program("sh");
  EXPECT_EQ(sh[0], '/');
  EXPECT_EQ(::access(sh.c_str(), X_OK), 0);
  EXPECT_EQ(resolve_program("/bin/sh"), "/bin/sh");
}

TEST(ProgramPath, MissingProgramIsUsageError) {
  try {
    resolve_program("no-such-program-dstrain-test");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("no-such-program-dstrain-test"), std::string::npos);
  }
  EXPECT_THROW(resolve_program("/nonexistent/prog"), Error);
  std::string plain = ::testing::TempDir() + "dstrain_not_executable";
  std::FILE* file = std::fopen(plain.c_str(), "w");
  ASSERT_TRUE(file != nullptr);
  std::fclose(file);
  EXPECT_THROW(resolve_program(plain), Error);  // exists, but has no execute bit
}

}  // namespace
}  // namespace dstrain::launcher
