#pragma once
// CPU communicator on Gloo (LibTorch 1.13 c10d). See docs/comm.md for algorithms and byte counting.
//
// Construction is the rendezvous: rank 0 hosts a TCPStore at master_addr:master_port, every rank
// announces itself, then a ProcessGroupGloo connects all pairs. `options.timeout` bounds the
// rendezvous and every collective. A world of one needs no store and opens no port.
//
// Dtypes: float32 (required), float64, bfloat16 and float16. reduce_scatter/all_gather/broadcast
// move the buffer's own dtype; all_reduce of bfloat16/float16 goes through a float32 copy
// (Gloo 1.13 has no bfloat16 reduction), so it sends and counts 4 bytes per element.

#include <memory>

#include "comm/communicator.h"

namespace dstrain::comm {

// Throws Error(kTimeout) naming the ranks that never joined, Error(kComm) for other failures.
std::unique_ptr<Communicator> make_gloo_communicator(const RendezvousOptions& options);

}  // namespace dstrain::comm
