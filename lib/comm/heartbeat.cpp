#include "comm/heartbeat.h"

#include <algorithm>

#include <fmt/format.h>

#include "comm/rendezvous.h"

namespace dstrain::comm {
namespace {

std::string beat_key(int rank) {
  return fmt::format("dstrain/heartbeat/{}", rank);
}

std::string state_key(int rank, const char* what) {
  return fmt::format("dstrain/heartbeat/{}/{}", rank, what);
}

bool contains(const std::vector<int>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

std::string ranks_clause(const std::vector<int>& ranks, const char* one, const char* many) {
  return fmt::format("rank{} {} {}", ranks.size() > 1 ? "s" : "", join_ranks(ranks),
                     ranks.size() > 1 ? many : one);
}

}  // namespace

Heartbeat::Heartbeat(const RendezvousOptions& options, std::chrono::milliseconds interval)
    : options_(options), interval_(interval) {
  beat_store_ = connect_store(options_, /*host_server=*/false);
  beat_store_->add(beat_key(options_.rank), 1);
  thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  leave();
}

void Heartbeat::entered(uint64_t seq) {
  entered_.store(seq, std::memory_order_relaxed);
}

void Heartbeat::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, interval_, [this] { return stop_; })) {
    try {
      beat();
    } catch (const std::exception&) {
      return;  // the store is gone; diagnose() will say so
    }
  }
}

// What this rank has entered goes first, so a peer that sees the beat sees the progress with it.
void Heartbeat::beat() {
  const uint64_t entered = entered_.load(std::memory_order_relaxed);
  if (entered != published_entered_) {
    beat_store_->add(state_key(options_.rank, "entered"),
                     static_cast<int64_t>(entered - published_entered_));
    published_entered_ = entered;
  }
  beat_store_->add(beat_key(options_.rank), 1);
}

std::vector<Heartbeat::PeerState> Heartbeat::sample(c10d::TCPStore& store) const {
  std::vector<PeerState> states(static_cast<size_t>(options_.world_size));
  for (int r = 0; r < options_.world_size; ++r) {
    PeerState& s = states[static_cast<size_t>(r)];
    s.beats = store.add(beat_key(r), 0);
    s.entered = store.add(state_key(r, "entered"), 0);
    s.failed = store.add(state_key(r, "failed"), 0);
    s.done = store.add(state_key(r, "done"), 0);
  }
  return states;
}

std::string Heartbeat::diagnose(uint64_t seq, CollectiveKind kind) {
  std::lock_guard<std::mutex> lock(diagnose_mutex_);
  if (!diagnosed_) {
    try {
      Samples samples = watch_peers();
      verdict_ = judge(samples, seq, kind);
    } catch (const std::exception&) {
      verdict_ = store_gone();
    }
    diagnosed_ = true;
  }
  return verdict_;
}

Heartbeat::Samples Heartbeat::watch_peers() {
  RendezvousOptions probe = options_;
  probe.timeout = std::max(interval_, std::chrono::milliseconds(1000));
  auto store = connect_store(probe, /*host_server=*/false);
  store->add(state_key(options_.rank, "failed"), 1);
  Samples s;
  s.first = s.last = sample(*store);
  auto all_accounted = [&] {
    for (int r = 0; r < options_.world_size; ++r) {
      const PeerState &a = s.first[r], &b = s.last[r];
      if (r != options_.rank && b.beats == a.beats && b.failed == 0 && b.done == 0) return false;
    }
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + interval_ * kSilenceIntervals;
  while (!all_accounted() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(interval_ / 2);
    s.last = sample(*store);
  }
  store->add(state_key(options_.rank, "done"), 1);
  return s;
}

std::string Heartbeat::judge(const Samples& s, uint64_t seq, CollectiveKind kind) {
  std::vector<int> slow;
  for (int r = 0; r < options_.world_size; ++r) {
    const PeerState &a = s.first[r], &b = s.last[r];
    if (r == options_.rank || b.failed > 0 || b.done > 0) continue;
    if (b.beats == a.beats) {
      dead_.push_back(r);
    } else if (b.entered < static_cast<int64_t>(seq)) {
      slow.push_back(r);
    }
  }
  std::string verdict;
  if (!dead_.empty()) {
    verdict = fmt::format("{} (no heartbeat for {:.1f} s)",
                          ranks_clause(dead_, "stopped responding", "stopped responding"),
                          (interval_ * kSilenceIntervals).count() / 1000.0);
  }
  if (!slow.empty()) {
    verdict += fmt::format(
        "{}{} the {} that failed (slow, or stuck elsewhere)", verdict.empty() ? "" : "; ",
        ranks_clause(slow, "is alive but had not reached", "are alive but had not reached"),
        to_string(kind));
  }
  return verdict;
}

std::string Heartbeat::store_gone() const {
  return fmt::format(
      "the rendezvous store at {} cannot be reached: rank 0 (its host) has exited or is "
      "unreachable",
      store_endpoint(options_));
}

void Heartbeat::leave() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (left_) return;
    left_ = true;
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  try {
    beat_store_->add(state_key(options_.rank, "done"), 1);
    if (options_.rank == 0) wait_for_peers_to_leave();
  } catch (const std::exception&) {
    // The store is gone: there is nobody left to tell or to wait for.
  }
}

// Rank 0 hosts the store: the other ranks write to it until they leave (their "done"), and a
// write to a store that is gone fails (and c10d prints a warning on every such rank). Waiting is
// short when nothing failed — the ranks leave together — and longer after a failure, when they may
// still be watching each other.
void Heartbeat::wait_for_peers_to_leave() {
  bool failure = false;
  std::vector<int> dead;
  {
    std::lock_guard<std::mutex> lock(diagnose_mutex_);
    failure = diagnosed_;
    dead = dead_;
  }
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    std::vector<PeerState> states = sample(*beat_store_);
    bool pending = false;
    for (int r = 1; r < options_.world_size; ++r) {
      const PeerState& s = states[static_cast<size_t>(r)];
      failure = failure || s.failed > 0;
      pending = pending || (s.done == 0 && !contains(dead, r));
    }
    const int limit = failure ? kLingerIntervals : kCleanLingerIntervals;
    if (!pending || std::chrono::steady_clock::now() >= start + interval_ * limit) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace dstrain::comm
