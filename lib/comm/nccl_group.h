#pragma once
// NcclGroup: one NCCL communicator over raw device pointers and CUDA streams (no LibTorch CUDA API,
// so it builds against a CPU-only LibTorch too). NcclCommunicator adapts it to torch::Tensor.
//
// Streams: the group owns a communication stream (cudaStreamNonBlocking). Every collective
//   1. records an event on the caller's compute stream and makes the comm stream wait on it (the
//      collective sees everything the compute stream did before the call; the host never blocks),
//   2. enqueues the NCCL call(s) on the comm stream,
//   3. records a completion event there, held by the returned NcclWork.
// NcclWork::wait(stream) makes a stream wait on that event (host does not block);
// NcclWork::synchronize() blocks the host, polling the event and ncclCommGetAsyncError, and past
// the timeout aborts the communicator (ncclCommAbort) and throws Error(kTimeout) instead of
// hanging.
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0): init and enqueue may answer
// ncclInProgress, and are polled up to the timeout, so a missing peer ends in Error(kTimeout) too.
// Not thread-safe: one thread issues the collectives of a group, in the same order on every rank.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "comm/communicator.h"

namespace dstrain::comm {

struct NcclGroupOptions {
  int rank = 0;
  int world_size = 1;
  int device = -1;  // -1: LOCAL_RANK (default 0)
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// State shared by a group and its outstanding works (a work may outlive its group).
struct NcclCommState;

class NcclWork {
 public:
  NcclWork(std::shared_ptr<NcclCommState> state, CollectiveKind kind, cudaEvent_t done);
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;
  ~NcclWork();  // releases the event; never blocks

  // `stream` waits for the collective; the host does not. Throws Error(kComm) if the communicator
  // already reported an asynchronous error or was aborted.
  void wait(cudaStream_t stream);
  // Blocks the host until the collective finished. Throws Error(kComm) on an NCCL error and
  // Error(kTimeout) naming the rank, the collective and the timeout when it takes longer (the
  // communicator is aborted first, so every later collective on it fails fast).
  void synchronize();
  // True once the collective finished on the device (never blocks).
  bool done() const;
  CollectiveKind kind() const { return kind_; }

 private:
  std::shared_ptr<NcclCommState> state_;
  CollectiveKind kind_;
  cudaEvent_t done_;
};

// One NCCL call on the group's communicator and comm stream.
using NcclCall = std::function<ncclResult_t(ncclComm_t comm, cudaStream_t stream)>;

// A buffer of a grouped all_reduce / the element type NCCL moves.
struct NcclBuffer {
  void* data = nullptr;
  size_t count = 0;
  ncclDataType_t dtype = ncclFloat32;
};

class NcclGroup {
 public:
  // A fresh id; rank 0 creates it and every rank must join with the same one.
  static ncclUniqueId new_unique_id();

  // Collective over all ranks: selects the device (cudaSetDevice), joins the communicator and
  // creates the comm stream. Throws Error(kRuntime) without a usable device, Error(kTimeout) when
  // the other ranks do not join within the timeout, Error(kComm) for NCCL failures.
  NcclGroup(const ncclUniqueId& id, const NcclGroupOptions& options);
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  // Waits (up to the timeout) for queued work, then destroys the communicator; aborts it instead
  // when that does not finish in time. Never throws.
  ~NcclGroup();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  cudaStream_t comm_stream() const { return comm_stream_; }
  std::chrono::milliseconds timeout() const;

  // In place; count elements of dtype.
  std::unique_ptr<NcclWork> all_reduce(void* data, size_t count, ncclDataType_t dtype,
                                       ncclRedOp_t op, cudaStream_t compute);
  // input holds world_size * output_count elements; rank r receives reduced chunk r.
  std::unique_ptr<NcclWork> reduce_scatter(const void* input, void* output, size_t output_count,
                                           ncclDataType_t dtype, ncclRedOp_t op,
                                           cudaStream_t compute);
  // output holds world_size * input_count elements; chunk r is rank r's input.
  std::unique_ptr<NcclWork> all_gather(const void* input, void* output, size_t input_count,
                                       ncclDataType_t dtype, cudaStream_t compute);
  std::unique_ptr<NcclWork> broadcast(void* data, size_t count, ncclDataType_t dtype, int root,
                                      cudaStream_t compute);
  // input and output hold world_size chunks of chunk_count elements (elem_size bytes each): chunk
  // j of the input goes to rank j, chunk j of the output comes from it. One ncclSend and one
  // ncclRecv per peer (itself included) in one NCCL group.
  std::unique_ptr<NcclWork> all_to_all(const void* input, void* output, size_t chunk_count,
                                       ncclDataType_t dtype, size_t elem_size,
                                       cudaStream_t compute);
  // One all_reduce per bucket inside ncclGroupStart/End: one fused launch, one completion event.
  std::unique_ptr<NcclWork> all_reduce_buckets(const std::vector<NcclBuffer>& buckets,
                                               ncclRedOp_t op, cudaStream_t compute);
  // Any calls, grouped the same way; `kind` names them in errors.
  std::unique_ptr<NcclWork> grouped(CollectiveKind kind, const std::vector<NcclCall>& calls,
                                    cudaStream_t compute);

  // Aborts the communicator (idempotent); later collectives throw Error(kComm).
  void abort();

 private:
  void make_current() const;
  void release_cuda_objects();
  // Polls ncclCommGetAsyncError while it answers ncclInProgress (up to the timeout).
  void wait_enqueued(const std::string& what);

  int rank_;
  int world_size_;
  int device_;
  std::shared_ptr<NcclCommState> state_;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // recorded on the compute stream before each collective
};

}  // namespace dstrain::comm
