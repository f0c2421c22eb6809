#pragma once
// Turns whatever Gloo/c10d threw during a collective into dstrain::Error: kTimeout when Gloo timed
// out, kComm otherwise, with a message naming the collective, this rank, and the peers at fault as
// far as the heartbeats show (heartbeat.h): dead ones, and live ones that had not reached it.

#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/heartbeat.h"

namespace dstrain::comm {

struct FailureContext {
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{0};
  std::shared_ptr<Heartbeat> heartbeat;  // null in a world of one
};

// `seq`: the collective's number on this rank (1, 2, ... in program order; Heartbeat::entered);
// for point-to-point transfers, which are not numbered, the last collective's. `what` names it in
// the message (default: the kind, e.g. "all_reduce"; a transfer's peers: describe_transfers).
[[noreturn]] void throw_collective_error(CollectiveKind kind, uint64_t seq,
                                         const FailureContext& context, std::exception_ptr cause,
                                         const std::string& what = "");

}  // namespace dstrain::comm
