#include "comm/rendezvous.h"

#include <cstdlib>
#include <thread>

#include <c10/util/Logging.h>

#include <fmt/format.h>

#include "core/error.h"

namespace dstrain::comm {
namespace {

std::string ready_key(int rank) {
  return fmt::format("dstrain/rank/{}/ready", rank);
}

double seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

std::vector<int> missing_ranks(c10d::TCPStore& store, int world_size) {
  std::vector<std::string> all;
  for (int r = 0; r < world_size; ++r) all.push_back(ready_key(r));
  if (store.check(all)) return {};
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    if (!store.check({ready_key(r)})) missing.push_back(r);
  }
  return missing;
}

}  // namespace

std::string store_endpoint(const RendezvousOptions& options) {
  return fmt::format("{}:{}", options.master_addr, options.master_port);
}

std::vector<int> split_members(c10d::Store& store, const std::string& prefix, int rank,
                               int world_size, int color) {
  const auto key = [&](int r) { return fmt::format("{}color/{}", prefix, r); };
  const std::string mine = std::to_string(color);
  store.set(key(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<int> members;
  for (int r = 0; r < world_size; ++r) {
    std::vector<uint8_t> value;
    try {
      value = store.get(key(r));
    } catch (const std::exception& e) {
      std::string cause = e.what();
      fail(ErrorKind::kTimeout,
           "rank {}: splitting the communicator: rank {} never said its group: {}", rank, r,
           cause.substr(0, cause.find('\n')));
    }
    if (std::string(value.begin(), value.end()) == mine) members.push_back(r);
  }
  return members;
}

std::string join_ranks(const std::vector<int>& ranks) {
  return fmt::format("{}", fmt::join(ranks, ", "));
}

void quiet_torch_log() {
  if (std::getenv("TORCH_CPP_LOG_LEVEL") != nullptr) {
    c10::initLogging();  // the user's level
  } else {
    FLAGS_caffe2_log_level = c10::GLOG_ERROR;
  }
}

c10::intrusive_ptr<c10d::TCPStore> connect_store(const RendezvousOptions& options,
                                                 bool host_server) {
  quiet_torch_log();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(options.master_port);
  store_options.isServer = host_server;
  store_options.waitWorkers = false;  // we wait ourselves, to name the missing ranks
  store_options.timeout = options.timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
  } catch (const std::exception& e) {
    std::string cause = e.what();
    cause = cause.substr(0, cause.find('\n'));
    if (host_server) {
      fail(ErrorKind::kComm, "rank 0 cannot host the rendezvous store at {}: {}",
           store_endpoint(options), cause);
    }
    fail(ErrorKind::kTimeout,
         "rank {} could not reach the rendezvous store at {} within {} s (rank 0 hosts it; is it "
         "running and is MASTER_ADDR/MASTER_PORT right?): {}",
         options.rank, store_endpoint(options), seconds(options.timeout), cause);
  }
}

namespace {

const char* const kFailedKey = "dstrain/rendezvous/failed";
const char* const kFailureSeenKey = "dstrain/rendezvous/failure_seen";

std::string timeout_message(const RendezvousOptions& options, const std::vector<int>& missing) {
  return fmt::format("rendezvous at {} timed out after {} s: rank{} {} of {} never joined",
                     store_endpoint(options), seconds(options.timeout),
                     missing.size() > 1 ? "s" : "", join_ranks(missing), options.world_size);
}

// Rank 0 decides the timeout for everyone: it publishes the verdict and keeps hosting the store
// briefly so the ranks that did join can read it (instead of losing the store mid-poll).
[[noreturn]] void publish_timeout(c10d::TCPStore& store, const RendezvousOptions& options,
                                  const std::vector<int>& missing) {
  std::string message = timeout_message(options, missing);
  store.set(kFailedKey, std::vector<uint8_t>(message.begin(), message.end()));
  const int64_t joined_peers = options.world_size - static_cast<int64_t>(missing.size()) - 1;
  auto linger_until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (store.add(kFailureSeenKey, 0) < joined_peers &&
         std::chrono::steady_clock::now() < linger_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw Error(ErrorKind::kTimeout, message);
}

void wait_for_all(c10d::TCPStore& store, const RendezvousOptions& options) {
  // Other ranks give rank 0 a grace second to publish its verdict before deciding on their own.
  auto deadline = std::chrono::steady_clock::now() + options.timeout +
                  std::chrono::milliseconds(options.rank == 0 ? 0 : 1000);
  for (;;) {
    std::vector<int> missing = missing_ranks(store, options.world_size);
    if (missing.empty()) return;
    if (options.rank != 0 && store.check({kFailedKey})) {
      std::vector<uint8_t> verdict = store.get(kFailedKey);
      store.add(kFailureSeenKey, 1);
      throw Error(ErrorKind::kTimeout, std::string(verdict.begin(), verdict.end()));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      if (options.rank == 0) publish_timeout(store, options, missing);
      fail(ErrorKind::kTimeout, "{}", timeout_message(options, missing));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

c10::intrusive_ptr<c10d::TCPStore> rendezvous(const RendezvousOptions& options) {
  auto store = connect_store(options, options.rank == 0);
  try {
    store->set(ready_key(options.rank), std::vector<uint8_t>{1});
    wait_for_all(*store, options);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string cause = e.what();
    fail(ErrorKind::kComm,
         "rank {} lost the rendezvous store at {} (rank 0 hosts it; did it exit?): {}",
         options.rank, store_endpoint(options), cause.substr(0, cause.find('\n')));
  }
  return store;
}

}  // namespace dstrain::comm
