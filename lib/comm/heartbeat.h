#pragma once
// Best-effort liveness of peers, used only to make collective errors name the ranks at fault.
// Each rank bumps the store counter `dstrain/heartbeat/<r>` every `interval` on its own store
// connection (a thread). After a collective fails, diagnose() samples all counters twice, a few
// intervals apart: ranks whose counter did not move are reported as not responding. If the store
// itself is gone, rank 0 (its host) is the likely casualty, and the message says so.

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/communicator.h"

namespace dstrain::comm {

class Heartbeat {
 public:
  Heartbeat(const RendezvousOptions& options, std::chrono::milliseconds interval);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;

  // A clause for an error message such as "rank 2 stopped responding"; empty if nothing was found.
  // Blocks for about three intervals. Thread-safe.
  std::string diagnose();

 private:
  void run();

  RendezvousOptions options_;
  std::chrono::milliseconds interval_;
  c10::intrusive_ptr<c10d::TCPStore> beat_store_;  // used by the beating thread only
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dstrain::comm
