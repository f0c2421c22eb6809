#include "comm/heartbeat.h"

#include <fmt/format.h>

#include "comm/rendezvous.h"

namespace dstrain::comm {
namespace {

std::string beat_key(int rank) {
  return fmt::format("dstrain/heartbeat/{}", rank);
}

std::vector<int64_t> sample(c10d::TCPStore& store, int world_size) {
  std::vector<int64_t> counters;
  for (int r = 0; r < world_size; ++r) counters.push_back(store.add(beat_key(r), 0));
  return counters;
}

}  // namespace

Heartbeat::Heartbeat(const RendezvousOptions& options, std::chrono::milliseconds interval)
    : options_(options), interval_(interval) {
  beat_store_ = connect_store(options_, /*host_server=*/false);
  beat_store_->add(beat_key(options_.rank), 1);
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

void Heartbeat::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, interval_, [this] { return stop_; })) {
    try {
      beat_store_->add(beat_key(options_.rank), 1);
    } catch (const std::exception&) {
      return;  // the store is gone; diagnose() will say so
    }
  }
}

std::string Heartbeat::diagnose() {
  RendezvousOptions probe = options_;
  probe.timeout = std::max(interval_, std::chrono::milliseconds(1000));
  try {
    auto store = connect_store(probe, /*host_server=*/false);
    std::vector<int64_t> before = sample(*store, options_.world_size);
    std::this_thread::sleep_for(interval_ * 3);
    std::vector<int64_t> after = sample(*store, options_.world_size);
    std::vector<int> silent;
    for (int r = 0; r < options_.world_size; ++r) {
      if (r != options_.rank && after[r] == before[r]) silent.push_back(r);
    }
    if (silent.empty()) return "";
    return fmt::format("rank{} {} stopped responding", silent.size() > 1 ? "s" : "",
                       join_ranks(silent));
  } catch (const std::exception&) {
    return fmt::format(
        "the rendezvous store at {} is unreachable, so rank 0 (its host) is likely gone",
        store_endpoint(options_));
  }
}

}  // namespace dstrain::comm
