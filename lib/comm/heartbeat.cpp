#include "comm/heartbeat.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <thread>

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

struct Heartbeat::Beating {
  c10::intrusive_ptr<c10d::TCPStore> store;  // this thread's connection, then leave()'s
  int rank = 0;
  std::chrono::milliseconds interval{0};
  std::atomic<uint64_t> entered{0};
  uint64_t published = 0;  // the thread's only

  std::mutex mutex;  // guards the flags below
  std::condition_variable changed;
  bool stop = false;
  bool left = false;
  bool finished = false;

  // What this rank has entered goes first, so a peer that sees the beat sees the progress with it.
  void beat() {
    const uint64_t now = entered.load(std::memory_order_relaxed);
    if (now != published) {
      store->add(state_key(rank, "entered"), static_cast<int64_t>(now - published));
      published = now;
    }
    store->add(beat_key(rank), 1);
  }

  // Beats until stopped, then records that this rank left on purpose. The store calls run without
  // the lock, so that leave() can always ask and give up waiting.
  void run() {
    std::unique_lock<std::mutex> lock(mutex);
    while (!changed.wait_for(lock, interval, [this] { return stop; })) {
      lock.unlock();
      bool gone = false;
      try {
        beat();
      } catch (const std::exception&) {
        gone = true;  // the store is gone; diagnose() will say so
      }
      lock.lock();
      if (gone) break;
    }
    lock.unlock();
    try {
      store->add(state_key(rank, "done"), 1);
    } catch (const std::exception&) {
      // The store is gone: there is nobody left to tell.
    }
    lock.lock();
    finished = true;
    changed.notify_all();
  }
};

Heartbeat::Heartbeat(const RendezvousOptions& options, std::chrono::milliseconds interval)
    : options_(options), interval_(interval), beating_(std::make_shared<Beating>()) {
  beating_->store = connect_store(options_, /*host_server=*/false);
  beating_->rank = options_.rank;
  beating_->interval = interval_;
  beating_->store->add(beat_key(options_.rank), 1);
  thread_ = std::thread([beating = beating_] { beating->run(); });
}

Heartbeat::~Heartbeat() {
  leave();
}

void Heartbeat::entered(uint64_t seq) {
  beating_->entered.store(seq, std::memory_order_relaxed);
}

std::vector<Heartbeat::PeerState> Heartbeat::sample(c10d::TCPStore& store, int world_size) {
  std::vector<PeerState> states(static_cast<size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
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
  if (diagnosed_) return verdict_;
  struct Watch {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    bool failed = false;
    Samples samples;
  };
  auto watch = std::make_shared<Watch>();
  std::thread([watch, options = options_, interval = interval_] {
    Samples samples;
    bool failed = false;
    try {
      samples = watch_peers(options, interval);
    } catch (const std::exception&) {
      failed = true;
    }
    std::lock_guard<std::mutex> done_lock(watch->mutex);
    watch->samples = std::move(samples);
    watch->failed = failed;
    watch->done = true;
    watch->done_cv.notify_all();
  }).detach();
  const auto limit = interval_ * kSilenceIntervals + kStoreAnswerLimit;
  std::unique_lock<std::mutex> watch_lock(watch->mutex);
  if (!watch->done_cv.wait_for(watch_lock, limit, [&] { return watch->done; })) {
    store_silent_ = true;
    verdict_ = store_silent(limit);
  } else {
    verdict_ = watch->failed ? store_gone() : judge(watch->samples, seq, kind);
  }
  diagnosed_ = true;
  return verdict_;
}

Heartbeat::Samples Heartbeat::watch_peers(const RendezvousOptions& options,
                                          std::chrono::milliseconds interval) {
  RendezvousOptions probe = options;
  probe.timeout = std::max(interval, std::chrono::milliseconds(1000));
  auto store = connect_store(probe, /*host_server=*/false);
  store->add(state_key(options.rank, "failed"), 1);
  Samples s;
  s.first = s.last = sample(*store, options.world_size);
  auto all_accounted = [&] {
    for (int r = 0; r < options.world_size; ++r) {
      const PeerState &a = s.first[r], &b = s.last[r];
      if (r != options.rank && b.beats == a.beats && b.failed == 0 && b.done == 0) return false;
    }
    return true;
  };
  const auto deadline = std::chrono::steady_clock::now() + interval * kSilenceIntervals;
  while (!all_accounted() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(interval / 2);
    s.last = sample(*store, options.world_size);
  }
  store->add(state_key(options.rank, "done"), 1);
  return s;
}

std::string Heartbeat::judge(const Samples& s, uint64_t seq, CollectiveKind kind) {
  // Transfers are not numbered (a pipeline's stages make different ones): a live peer cannot be
  // told behind, only a silent one dead.
  const bool point_to_point = kind == CollectiveKind::kSend || kind == CollectiveKind::kRecv;
  std::vector<int> slow;
  for (int r = 0; r < options_.world_size; ++r) {
    const PeerState &a = s.first[r], &b = s.last[r];
    if (r == options_.rank || b.failed > 0 || b.done > 0) continue;
    if (b.beats == a.beats) {
      dead_.push_back(r);
    } else if (!point_to_point && b.entered < static_cast<int64_t>(seq)) {
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

std::string Heartbeat::store_silent(std::chrono::milliseconds waited) const {
  return fmt::format(
      "the rendezvous store at {} did not answer within {:.1f} s: rank 0, which hosts it, is "
      "frozen (its process stopped) or its host is unreachable",
      store_endpoint(options_), static_cast<double>(waited.count()) / 1000.0);
}

// Waits for the beating thread to record that this rank left, at most kStoreAnswerLimit beyond an
// interval: a thread still blocked on a store that does not answer is let go (see the header).
void Heartbeat::leave() {
  {
    std::lock_guard<std::mutex> lock(beating_->mutex);
    if (beating_->left) return;
    beating_->left = beating_->stop = true;
  }
  beating_->changed.notify_all();
  bool finished = false;
  {
    std::unique_lock<std::mutex> lock(beating_->mutex);
    finished = beating_->changed.wait_for(lock, interval_ + kStoreAnswerLimit,
                                          [this] { return beating_->finished; });
  }
  if (!finished) {
    thread_.detach();
    return;
  }
  thread_.join();
  bool silent = false;
  {
    std::lock_guard<std::mutex> lock(diagnose_mutex_);
    silent = store_silent_;
  }
  if (options_.rank != 0 || silent) return;
  try {
    wait_for_peers_to_leave();
  } catch (const std::exception&) {
    // The store is gone: there is nobody left to wait for.
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
    std::vector<PeerState> states = sample(*beating_->store, options_.world_size);
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
