#pragma once
// Joining an NCCL communicator through the job's TCPStore: rank 0 creates the NCCL unique id and
// publishes it under `dstrain/nccl/unique_id`, the other ranks read it. A world of one needs no
// store. Internal to lib/comm and its tests (needs CUDA/NCCL headers).

#include <memory>
#include <string>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "comm/nccl_group.h"

namespace dstrain::comm {

struct NcclConnection {
  c10::intrusive_ptr<c10d::TCPStore> store;  // null in a world of one; keep it for the job
  std::unique_ptr<NcclGroup> group;
};

// Rank 0 (of the ranks joining) creates an NCCL unique id and publishes it under `key`; the others
// read it (the store's get waits up to its timeout: Error(kTimeout)). `rank` is the rank among
// the joining ranks; `where` names the store in messages.
ncclUniqueId exchange_unique_id(c10d::Store& store, const std::string& key, int rank,
                                const std::string& where);

// Collective over all ranks. Checks for a CUDA device before the rendezvous (Error(kRuntime)
// when there is none); then as rendezvous() and NcclGroup's constructor.
NcclConnection connect_nccl(const RendezvousOptions& options, int device);

}  // namespace dstrain::comm
