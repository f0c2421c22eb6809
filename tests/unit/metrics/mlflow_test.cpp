#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "metrics/mlflow_client.h"
#include "metrics/mlflow_sink.h"

namespace dstrain::metrics {
namespace {

LogBatch many(size_t metrics, size_t params, size_t tags, size_t value_bytes = 4) {
  LogBatch b;
  for (size_t i = 0; i < metrics; ++i) b.metrics.push_back({"m" + std::to_string(i), 1.0, 1, 1});
  for (size_t i = 0; i < params; ++i) {
    b.params.emplace_back("p" + std::to_string(i), std::string(value_bytes, 'x'));
  }
  for (size_t i = 0; i < tags; ++i) b.tags.emplace_back("t" + std::to_string(i), "v");
  return b;
}

TEST(SplitLogBatch, RespectsEveryServerLimitAndKeepsEverythingInOrder) {
  const LogBatch in = many(2500, 250, 130);
  const auto out = split_log_batch(in);
  size_t metrics = 0, params = 0, tags = 0;
  for (const auto& b : out) {
    EXPECT_LE(b.metrics.size(), 1000u);
    EXPECT_LE(b.params.size(), 100u);
    EXPECT_LE(b.tags.size(), 100u);
    EXPECT_LE(b.metrics.size() + b.params.size() + b.tags.size(), 1000u);
    for (const auto& m : b.metrics) EXPECT_EQ(m.key, "m" + std::to_string(metrics++));
    for (const auto& p : b.params) EXPECT_EQ(p.first, "p" + std::to_string(params++));
    for (const auto& t : b.tags) EXPECT_EQ(t.first, "t" + std::to_string(tags++));
  }
  EXPECT_EQ(metrics, 2500u);
  EXPECT_EQ(params, 250u);
  EXPECT_EQ(tags, 130u);
}

TEST(SplitLogBatch, LongValuesAreSpreadToKeepRequestsUnderTheSizeLimit) {
  LogBatch in = many(0, 100, 0, kMaxParamValueLength);
  for (int i = 0; i < 100; ++i) {
    in.tags.emplace_back("t" + std::to_string(i), std::string(kMaxTagValueLength, 'y'));
  }
  const auto out = split_log_batch(in);  // 1.4 MB of values: more than one 1 MB request
  ASSERT_GT(out.size(), 1u);
  for (const auto& b : out) {
    size_t bytes = 0;
    for (const auto& p : b.params) bytes += p.second.size();
    for (const auto& t : b.tags) bytes += t.second.size();
    EXPECT_LE(bytes, 900000u);
  }
}

TEST(SplitLogBatch, NothingGivesNoRequest) {
  EXPECT_TRUE(split_log_batch({}).empty());
}

// A loopback port with nothing listening: connections are refused at once.
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST(MlflowSink, ADeadServerNeitherBlocksWritesNorFinishPastItsTimeout) {
  using Clock = std::chrono::steady_clock;
  MlflowOptions o;
  o.connection.tracking_uri = "http://127.0.0.1:" + std::to_string(closed_port());
  o.max_queued_metrics = 50;
  MlflowSink sink(o);
  const auto t0 = Clock::now();
  for (int step = 1; step <= 1000; ++step) {
    Record r{step, {}};
    r.add("train/loss", 1.0);
    sink.write(r);
  }
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  const auto t1 = Clock::now();
  sink.finish(RunStatus::kFinished, 2);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t1).count(), 3.5);
}

// A loopback socket that listens and never answers: connections complete in the kernel's backlog
// and requests then wait (a hung server).
class SilentServer {
 public:
  SilentServer() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(fd_, 16);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~SilentServer() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(MlflowSink, FinishAbortsARequestAHungServerHoldsAtTheDeadline) {
  using Clock = std::chrono::steady_clock;
  SilentServer server;
  MlflowOptions o;
  o.connection.tracking_uri = "http://127.0.0.1:" + std::to_string(server.port());
  o.connection.timeout_s = 30;  // longer than the test: only the deadline can end the request
  Clock::time_point t0;
  {
    MlflowSink sink(o);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the worker's request waits
    t0 = Clock::now();
    sink.finish(RunStatus::kKilled, 1);
  }  // joins the worker: returns only once its request was aborted
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
}

// The last third of finish()'s time is the status request's: a request still waiting for a slow
// server when that part begins is aborted then, not at the deadline (with a hung server nothing
// else is sent, so finish() returns once it was aborted). libcurl checks for an abort about once a
// second, hence the margins.
TEST(MlflowSink, ARequestInFlightIsAbortedWhereTheStatusTimeBegins) {
  using Clock = std::chrono::steady_clock;
  SilentServer server;
  MlflowOptions o;
  o.connection.tracking_uri = "http://127.0.0.1:" + std::to_string(server.port());
  o.connection.timeout_s = 30;
  MlflowSink sink(o);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto t0 = Clock::now();
  sink.finish(RunStatus::kKilled, 9);  // the status's part: the last 3 s
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(seconds, 5.9);
  EXPECT_LT(seconds, 8.5);  // at the deadline (9 s) when the request may run into the reserve
}

TEST(MlflowClient, AnUnreachableServerIsAnErrorNamingTheEndpoint) {
  MlflowConnection c;
  c.tracking_uri = "http://127.0.0.1:" + std::to_string(closed_port()) + "/";
  c.timeout_s = 2;
  MlflowClient client(c);
  try {
    client.get_run("abc");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("/api/2.0/mlflow/runs/get?run_id=abc"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dstrain::metrics
