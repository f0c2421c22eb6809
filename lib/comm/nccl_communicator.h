#pragma once
// CUDA communicator on NCCL, over torch::Tensor device buffers. This header needs no CUDA headers:
// a stream is passed as `CudaStream`, which is the same type as cudaStream_t.
//
// Streams and waiting (as in PyTorch's ProcessGroupNCCL): a collective is ordered after everything
// already queued on the compute stream and runs on the communicator's own stream. Work::wait()
// makes the compute stream wait for it and returns at once (the host does not block);
// synchronize(work) blocks the host, with the timeout watchdog (RendezvousOptions::timeout): past
// it the NCCL communicator is aborted and Error(kTimeout) names the rank and the collective.
// The Work keeps its tensors alive until it is destroyed.
//
// Compute stream: NcclCommunicatorOptions::compute_stream, called at every collective and wait().
// Default: with a CUDA LibTorch (DSTRAIN_CUDA) the current c10 CUDA stream, else the legacy
// default stream.
//
// Byte counters follow the same ring theory as the Gloo communicator (docs/comm.md), with the
// tensor's own element size (NCCL reduces bfloat16/float16 natively).
//
// Buffers: contiguous floating-point CUDA tensors on this rank's device (float32, float64,
// bfloat16, float16); a CPU tensor is Error(kInternal).

#include <functional>
#include <memory>

#include "comm/communicator.h"

struct CUstream_st;

namespace dstrain::comm {

using CudaStream = CUstream_st*;  // cudaStream_t
using StreamProvider = std::function<CudaStream()>;

struct NcclCommunicatorOptions {
  int device = -1;                // -1: LOCAL_RANK (default 0)
  StreamProvider compute_stream;  // empty: see above
};

// True when this build has the NCCL communicator (CUDA toolkit and NCCL found at configure time).
bool nccl_available();

// Collective over all ranks: rendezvous through the TCPStore (rank 0 hosts it and publishes the
// NCCL unique id), then NCCL init on the chosen device. Throws Error(kRuntime) without a usable
// CUDA device, Error(kTimeout) when ranks do not join in time, Error(kComm) for NCCL failures,
// Error(kNotImplemented) when the build has no NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(const RendezvousOptions& options,
                                                     NcclCommunicatorOptions nccl_options = {});

// Blocks the host until `work` is done (see above); for a non-NCCL Work it is work.wait().
void synchronize(Work& work);

}  // namespace dstrain::comm
