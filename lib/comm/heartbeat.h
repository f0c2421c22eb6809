#pragma once
// Liveness of peers, used only to make collective errors name the ranks at fault, and then only on
// evidence. Each rank runs a thread that every `interval`, on a store connection of its own,
// publishes how many collectives this rank has entered (`dstrain/heartbeat/<r>/entered`) and bumps
// its beat counter (`dstrain/heartbeat/<r>`). Two more counters record what a rank says of itself:
// `.../failed` (it saw a collective fail: alive, and diagnosing) and `.../done` (it finished
// diagnosing, or left on purpose).
//
// When a collective fails, diagnose() watches the other ranks' counters for up to
// kSilenceIntervals intervals, and stops early once each has beaten or spoken for itself:
//  - A rank that neither beat nor spoke in that whole window is named: "rank 2 stopped responding
//    (no heartbeat for 3.0 s)". Its beating thread is independent of its work and would have beaten
//    6 times, so a slow, busy or briefly starved rank is not named; a rank whose process died or is
//    frozen, or whose host is cut off, is.
//  - A live rank that has not entered the collective that failed is named slow, not dead:
//    "rank 1 is alive but had not reached the all_reduce that failed (slow, or stuck elsewhere)".
//  - A rank that saw the failure too, or left, is not named: it is neither dead nor behind.
//  - Point-to-point transfers (send, recv) are not numbered, so for them only silent ranks are
//    named.
// The first answer is kept: the collectives that fail after it (a broken group fails them all)
// return it at once instead of watching again.
//
// The store lives in rank 0. If it cannot be reached the message says so (rank 0 exited or its
// host is unreachable). So that rank 0 does not cause that merely by finishing first, leave() on
// rank 0 waits, bounded, for the other ranks to leave.
//
// A store that does not answer. c10d's store client waits for an answer without a limit, and a
// stopped process (or a frozen host) keeps its connections open: rank 0 frozen would block every
// other rank's store call forever. So no store call of this class runs on the caller's thread
// unbounded: diagnose() watches on a thread of its own and gives up after kSilenceIntervals
// intervals plus kStoreAnswerLimit ("the rendezvous store ... did not answer"), and leave() waits
// for the beating thread only kStoreAnswerLimit. A thread still blocked then is detached: it owns
// what it uses (shared state, its own store connection) and ends with the process.

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/communicator.h"

namespace dstrain::comm {

class Heartbeat {
 public:
  // Silence that names a rank dead; how long rank 0 waits in leave() for the other ranks to leave,
  // after a failure and without one; all in intervals.
  static constexpr int kSilenceIntervals = 6;
  static constexpr int kLingerIntervals = 12;
  static constexpr int kCleanLingerIntervals = 2;
  // How long a store call may take before the store is taken for frozen.
  static constexpr std::chrono::milliseconds kStoreAnswerLimit{3000};

  Heartbeat(const RendezvousOptions& options, std::chrono::milliseconds interval);
  ~Heartbeat();  // leave()
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // This rank started its collective number `seq` (1, 2, ... in program order). Cheap: published by
  // the next beat. Called on the communicator thread.
  void entered(uint64_t seq);

  // A clause for the error message of collective `seq` (a `kind`), naming dead and slow peers as
  // described above; empty when no peer is at fault. Blocks for up to kSilenceIntervals intervals
  // on the first call. Thread-safe.
  std::string diagnose(uint64_t seq, CollectiveKind kind);

  // Stops beating and records that this rank left on purpose. On rank 0 then waits until every
  // other rank has left (or was found dead), so that the store they use stays up: at most
  // kLingerIntervals after a failure (they may still be diagnosing), kCleanLingerIntervals
  // otherwise. Idempotent; the communicator calls it when it is destroyed.
  void leave();

 private:
  struct PeerState {
    int64_t beats = 0, entered = 0, failed = 0, done = 0;
  };

  struct Samples {
    std::vector<PeerState> first, last;  // by rank, when the watch began and ended
  };

  // The beating thread's state, shared with it so that it can outlive this object (detached).
  struct Beating;

  static std::vector<PeerState> sample(c10d::TCPStore& store, int world_size);
  // Samples every rank until each has beaten or spoken for itself, or kSilenceIntervals pass;
  // records this rank's failed and done. Throws when the store cannot be reached. Blocks as long as
  // the store does not answer: diagnose() runs it on a thread of its own.
  static Samples watch_peers(const RendezvousOptions& options, std::chrono::milliseconds interval);
  // The clause naming dead and slow ranks (dead_ is filled here); "" when none is at fault.
  std::string judge(const Samples& samples, uint64_t seq, CollectiveKind kind);
  void wait_for_peers_to_leave();
  std::string store_gone() const;
  std::string store_silent(std::chrono::milliseconds waited) const;

  RendezvousOptions options_;
  std::chrono::milliseconds interval_;
  std::shared_ptr<Beating> beating_;
  std::thread thread_;

  std::mutex diagnose_mutex_;  // guards the fields below; held while watching
  bool diagnosed_ = false;
  bool store_silent_ = false;  // the watch gave up on the store: leave() waits for nobody
  std::string verdict_;
  std::vector<int> dead_;
};

}  // namespace dstrain::comm
