#pragma once
// Rendezvous of a job's ranks through c10d's TCPStore, hosted by rank 0 at MASTER_ADDR:MASTER_PORT.
// Every rank announces itself with the key `dstrain/rank/<r>/ready`; waiting for all of them
// (rather than letting the store block) means a timeout can say exactly which ranks never joined.

#include <string>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/communicator.h"

namespace dstrain::comm {

// "host:port" of the store, for messages.
std::string store_endpoint(const RendezvousOptions& options);

// LibTorch's own C++ log (c10's LOG, c10d's warnings) from now on at ERROR and above, unless
// TORCH_CPP_LOG_LEVEL names a level (then that one). When a peer dies, c10d logs the failed store
// read as a warning with the exception's C++ backtrace (9 frames) before dstrain's one-line reason
// (rank, host, cause); the backtrace says nothing a user can act on. Called by connect_store, so
// every process that joins a job.
void quiet_torch_log();

// Opens a store connection (rank 0 also hosts the server when `host_server`). Throws Error(kComm)
// when the port cannot be bound, Error(kTimeout) when the store cannot be reached within the
// timeout.
c10::intrusive_ptr<c10d::TCPStore> connect_store(const RendezvousOptions& options,
                                                 bool host_server);

// Connects (rank 0 hosts) and returns once all world_size ranks have announced themselves.
// Throws Error(kTimeout) "rendezvous at A:P timed out after T s: ranks 2, 3 of 4 never joined".
c10::intrusive_ptr<c10d::TCPStore> rendezvous(const RendezvousOptions& options);

// Communicator::split's exchange: every rank of a world of `world_size` publishes its color under
// `<prefix>color/<rank>` and reads everyone's (the store's get waits up to its timeout). Returns
// the ranks with this rank's color, ascending. Error(kTimeout) naming a rank whose color never
// came.
std::vector<int> split_members(c10d::Store& store, const std::string& prefix, int rank,
                               int world_size, int color);

// "2, 3" style list for messages.
std::string join_ranks(const std::vector<int>& ranks);

}  // namespace dstrain::comm
