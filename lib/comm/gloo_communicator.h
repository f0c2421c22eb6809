#pragma once
// CPU communicator on Gloo (LibTorch's c10d ProcessGroupGloo). See docs/comm.md for algorithms
// and byte counting.
//
// Construction is the rendezvous: rank 0 hosts a TCPStore at master_addr:master_port, every rank
// announces itself, then a ProcessGroupGloo connects all pairs. `options.timeout` bounds the
// rendezvous and every collective. A world of one needs no store and opens no port.
//
// Dtypes: float32, float64, bfloat16 and float16; every collective moves and reduces the buffer's
// own dtype.

#include <memory>

#include "comm/communicator.h"

namespace dstrain::comm {

// Throws Error(kTimeout) naming the ranks that never joined, Error(kComm) for other failures.
std::unique_ptr<Communicator> make_gloo_communicator(const RendezvousOptions& options);

}  // namespace dstrain::comm
