// quiet_torch_log (comm/rendezvous.h): when the store's host is gone, a rank's failed store read
// makes c10d log a warning with the exception's C++ backtrace; after quiet_torch_log nothing of it
// reaches stderr, and the read still fails with its cause.
#include <cstdlib>
#include <string>

#include <c10/util/Logging.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/logging.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/rendezvous.h"

namespace dstrain::comm {
namespace {

// What a failed read of a store whose server is gone prints on stderr.
std::string stderr_of_a_read_after_the_server_left() {
  c10d::TCPStoreOptions options;
  options.port = 0;
  options.isServer = true;
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(5);
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  options.isServer = false;
  options.port = server->getPort();
  auto client = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  client->set("key", {1});
  server.reset();
  ::testing::internal::CaptureStderr();
  EXPECT_ANY_THROW(client->get("key"));
  return ::testing::internal::GetCapturedStderr();
}

TEST(TorchLog, AStoreReadFailingBecauseAPeerLeftPrintsNoBacktrace) {
  ::unsetenv("TORCH_CPP_LOG_LEVEL");
  FLAGS_caffe2_log_level = c10::GLOG_WARNING;  // LibTorch's default
  const std::string loud = stderr_of_a_read_after_the_server_left();
  // The case this test is about: "[c10d] recvValueWithTimeout failed on SocketImpl(...)", then
  // "Exception raised from recvBytes at ..." and the frames.
  EXPECT_NE(loud.find("[c10d]"), std::string::npos) << loud;
  EXPECT_NE(loud.find("frame #"), std::string::npos) << loud;
  quiet_torch_log();
  EXPECT_FALSE(c10d::detail::isLogLevelEnabled(c10d::detail::LogLevel::Warning));
  EXPECT_TRUE(c10d::detail::isLogLevelEnabled(c10d::detail::LogLevel::Error));
  const std::string quiet = stderr_of_a_read_after_the_server_left();
  EXPECT_EQ(quiet, "");
}

TEST(TorchLog, TheUsersLevelWins) {
  ::setenv("TORCH_CPP_LOG_LEVEL", "INFO", 1);
  quiet_torch_log();
  EXPECT_TRUE(c10d::detail::isLogLevelEnabled(c10d::detail::LogLevel::Info));
  ::unsetenv("TORCH_CPP_LOG_LEVEL");
  quiet_torch_log();
  EXPECT_FALSE(c10d::detail::isLogLevelEnabled(c10d::detail::LogLevel::Warning));
}

}  // namespace
}  // namespace dstrain::comm
