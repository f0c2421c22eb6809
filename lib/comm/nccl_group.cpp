// NcclGroup and NcclWork. The host only ever blocks in NcclWork::synchronize(), in init and in
// the short ncclInProgress polls of a non-blocking communicator; each of those waits is bounded by
// the group's timeout and ends in ncclCommAbort + Error(kTimeout) rather than a hang.

#include "comm/nccl_group.h"

#include <thread>

#include "comm/nccl_check.h"
#include "core/log.h"

namespace dstrain::comm {

struct NcclCommState {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int world_size = 1;
  int device = 0;
  std::chrono::milliseconds timeout{0};
  bool aborted = false;
  bool closed = false;  // the group destroyed the communicator; works only query their events

  void abort() {
    if (aborted || closed || comm == nullptr) return;
    aborted = true;
    ncclCommAbort(comm);
  }
  // ncclSuccess, ncclInProgress, or the asynchronous error the communicator hit.
  ncclResult_t async_error() const {
    // After ncclCommAbort or destroy the handle is gone: never query it (callers check `aborted`).
    if (aborted || closed || comm == nullptr) return ncclSuccess;
    ncclResult_t result = ncclSuccess;
    ncclResult_t status = ncclCommGetAsyncError(comm, &result);
    return status == ncclSuccess ? result : status;
  }
  void check_usable(const char* what) const {
    if (aborted) {
      fail(ErrorKind::kComm,
           "rank {}: {}: the NCCL communicator was aborted after an earlier failure or timeout",
           rank, what);
    }
    if (closed)
      fail(ErrorKind::kInternal, "rank {}: {} after the NCCL group was destroyed", rank, what);
  }
};

namespace {

using Clock = std::chrono::steady_clock;

void pause_briefly() {
  std::this_thread::sleep_for(std::chrono::microseconds(200));
}

}  // namespace

// ----- NcclWork -----

NcclWork::NcclWork(std::shared_ptr<NcclCommState> state, CollectiveKind kind, cudaEvent_t done)
    : state_(std::move(state)), kind_(kind), done_(done) {}

NcclWork::~NcclWork() {
  if (done_ != nullptr) cudaEventDestroy(done_);  // resources go once the event completes
}

bool NcclWork::done() const {
  return cudaEventQuery(done_) == cudaSuccess;
}

void NcclWork::wait(cudaStream_t stream) {
  state_->check_usable(to_string(kind_));
  check_nccl(state_->async_error(), state_->rank,
             fmt::format("{} failed asynchronously", to_string(kind_)));
  check_cuda(cudaStreamWaitEvent(stream, done_, 0), state_->rank,
             fmt::format("making the compute stream wait for {}", to_string(kind_)));
}

void NcclWork::synchronize() {
  const auto deadline = Clock::now() + state_->timeout;
  const int rank = state_->rank;
  for (;;) {
    cudaError_t query = cudaEventQuery(done_);
    if (query == cudaSuccess) break;
    if (query != cudaErrorNotReady) {
      check_cuda(query, rank, fmt::format("waiting for {}", to_string(kind_)));
    }
    if (state_->aborted) state_->check_usable(to_string(kind_));  // another wait gave up on it
    ncclResult_t async = state_->async_error();
    if (async != ncclSuccess && async != ncclInProgress) {
      state_->abort();
      check_nccl(async, rank, fmt::format("{} failed (communicator aborted)", to_string(kind_)));
    }
    if (Clock::now() >= deadline) {
      state_->abort();
      fail(ErrorKind::kTimeout,
           "rank {}: {} did not complete within {} s on CUDA device {} (world of {}); the NCCL "
           "communicator was aborted. A peer may have died or stopped issuing collectives; raise "
           "DSTRAIN_COMM_TIMEOUT if the work is just slow",
           rank, to_string(kind_), to_seconds(state_->timeout), state_->device, state_->world_size);
    }
    pause_briefly();
  }
  check_nccl(state_->async_error(), rank, fmt::format("{} failed", to_string(kind_)));
}

// ----- NcclGroup -----

ncclUniqueId NcclGroup::new_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), 0, "creating the NCCL unique id");
  return id;
}

NcclGroup::NcclGroup(const ncclUniqueId& id, const NcclGroupOptions& options)
    : rank_(options.rank),
      world_size_(options.world_size),
      device_(pick_device(options.device, cuda_device_count())),
      state_(std::make_shared<NcclCommState>()) {
  state_->rank = rank_;
  state_->world_size = world_size_;
  state_->device = device_;
  state_->timeout = options.timeout;
  try {
    make_current();
    check_cuda(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking), rank_,
               "creating the NCCL stream");
    check_cuda(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), rank_,
               "creating a CUDA event");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclUniqueId id_copy = id;
    check_nccl(ncclCommInitRankConfig(&state_->comm, world_size_, id_copy, rank_, &config), rank_,
               fmt::format("joining the NCCL communicator (world of {})", world_size_));
    wait_enqueued(
        fmt::format("joining the NCCL communicator (world of {}: are all ranks up?)", world_size_));
  } catch (...) {
    state_->abort();  // wait_enqueued aborted already on timeout; abort() is idempotent
    release_cuda_objects();
    throw;
  }
  log::debug("rank {}: NCCL communicator ready on CUDA device {}", rank_, device_);
}

NcclGroup::~NcclGroup() {
  try {
    make_current();
  } catch (const std::exception& e) {
    log::warn("{}", e.what());
  }
  if (!state_->aborted && state_->comm != nullptr) {
    const auto deadline = Clock::now() + state_->timeout;
    while (cudaStreamQuery(comm_stream_) == cudaErrorNotReady && Clock::now() < deadline) {
      pause_briefly();
    }
    bool clean = cudaStreamQuery(comm_stream_) == cudaSuccess;
    if (clean) {
      const ncclResult_t finalize = ncclCommFinalize(state_->comm);
      clean = finalize == ncclSuccess || finalize == ncclInProgress;
    }
    while (clean && state_->async_error() == ncclInProgress && Clock::now() < deadline) {
      pause_briefly();
    }
    if (clean && state_->async_error() == ncclSuccess) {
      ncclCommDestroy(state_->comm);
    } else {
      log::warn("rank {}: NCCL communicator did not finish cleanly; aborting it", rank_);
      state_->abort();
    }
  }
  release_cuda_objects();
}

void NcclGroup::release_cuda_objects() {
  state_->closed = true;
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (comm_stream_ != nullptr) cudaStreamDestroy(comm_stream_);
  ready_ = nullptr;
  comm_stream_ = nullptr;
}

void NcclGroup::make_current() const {
  check_cuda(cudaSetDevice(device_), rank_, fmt::format("selecting CUDA device {}", device_));
}

void NcclGroup::wait_enqueued(const std::string& what) {
  const auto deadline = Clock::now() + state_->timeout;
  for (;;) {
    ncclResult_t status = state_->async_error();
    if (status == ncclSuccess) return;
    if (status != ncclInProgress) {
      state_->abort();
      check_nccl(status, rank_, what);
    }
    if (Clock::now() >= deadline) {
      state_->abort();
      fail(ErrorKind::kTimeout,
           "rank {}: {}: not done within {} s on CUDA device {}; the NCCL communicator was aborted",
           rank_, what, to_seconds(state_->timeout), device_);
    }
    pause_briefly();
  }
}

std::unique_ptr<NcclWork> NcclGroup::grouped(CollectiveKind kind,
                                             const std::vector<NcclCall>& calls,
                                             cudaStream_t compute) {
  const char* name = to_string(kind);
  state_->check_usable(name);
  make_current();
  check_cuda(cudaEventRecord(ready_, compute), rank_,
             fmt::format("{}: recording the compute stream", name));
  check_cuda(cudaStreamWaitEvent(comm_stream_, ready_, 0), rank_,
             fmt::format("{}: ordering the NCCL stream after the compute stream", name));
  const bool group = calls.size() > 1;
  if (group) check_nccl(ncclGroupStart(), rank_, fmt::format("{}: ncclGroupStart", name));
  try {
    for (const NcclCall& call : calls) {
      check_nccl(call(state_->comm, comm_stream_), rank_, fmt::format("enqueueing {}", name));
    }
  } catch (...) {
    if (group) ncclGroupEnd();  // leave NCCL's group state balanced; the communicator is unusable
    state_->abort();
    throw;
  }
  if (group) check_nccl(ncclGroupEnd(), rank_, fmt::format("{}: ncclGroupEnd", name));
  wait_enqueued(fmt::format("enqueueing {}", name));
  cudaEvent_t done = nullptr;
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), rank_,
             "creating a CUDA event");
  auto work = std::make_unique<NcclWork>(state_, kind, done);
  check_cuda(cudaEventRecord(done, comm_stream_), rank_,
             fmt::format("{}: recording completion", name));
  return work;
}

void NcclGroup::abort() {
  state_->abort();
}

std::unique_ptr<NcclWork> NcclGroup::all_reduce(void* data, size_t count, ncclDataType_t dtype,
                                                ncclRedOp_t op, cudaStream_t compute) {
  return grouped(CollectiveKind::kAllReduce, {[=](ncclComm_t comm, cudaStream_t stream) {
                   return ncclAllReduce(data, data, count, dtype, op, comm, stream);
                 }},
                 compute);
}

std::unique_ptr<NcclWork> NcclGroup::reduce_scatter(const void* input, void* output,
                                                    size_t output_count, ncclDataType_t dtype,
                                                    ncclRedOp_t op, cudaStream_t compute) {
  return grouped(CollectiveKind::kReduceScatter, {[=](ncclComm_t comm, cudaStream_t stream) {
                   return ncclReduceScatter(input, output, output_count, dtype, op, comm, stream);
                 }},
                 compute);
}

std::unique_ptr<NcclWork> NcclGroup::all_gather(const void* input, void* output, size_t input_count,
                                                ncclDataType_t dtype, cudaStream_t compute) {
  return grouped(CollectiveKind::kAllGather, {[=](ncclComm_t comm, cudaStream_t stream) {
                   return ncclAllGather(input, output, input_count, dtype, comm, stream);
                 }},
                 compute);
}

std::unique_ptr<NcclWork> NcclGroup::broadcast(void* data, size_t count, ncclDataType_t dtype,
                                               int root, cudaStream_t compute) {
  if (root < 0 || root >= world_size_) {
    fail(ErrorKind::kInternal, "broadcast: root {} is not a rank of a world of {}", root,
         world_size_);
  }
  return grouped(CollectiveKind::kBroadcast, {[=](ncclComm_t comm, cudaStream_t stream) {
                   return ncclBroadcast(data, data, count, dtype, root, comm, stream);
                 }},
                 compute);
}

std::unique_ptr<NcclWork> NcclGroup::all_to_all(const void* input, void* output, size_t chunk_count,
                                                ncclDataType_t dtype, size_t elem_size,
                                                cudaStream_t compute) {
  std::vector<NcclCall> calls;
  const size_t chunk_bytes = chunk_count * elem_size;
  for (int peer = 0; peer < world_size_; ++peer) {
    const void* send = static_cast<const char*>(input) + static_cast<size_t>(peer) * chunk_bytes;
    void* recv = static_cast<char*>(output) + static_cast<size_t>(peer) * chunk_bytes;
    calls.push_back([=](ncclComm_t comm, cudaStream_t stream) {
      return ncclSend(send, chunk_count, dtype, peer, comm, stream);
    });
    calls.push_back([=](ncclComm_t comm, cudaStream_t stream) {
      return ncclRecv(recv, chunk_count, dtype, peer, comm, stream);
    });
  }
  return grouped(CollectiveKind::kAllToAll, calls, compute);
}

std::chrono::milliseconds NcclGroup::timeout() const {
  return state_->timeout;
}

std::unique_ptr<NcclWork> NcclGroup::all_reduce_buckets(const std::vector<NcclBuffer>& buckets,
                                                        ncclRedOp_t op, cudaStream_t compute) {
  std::vector<NcclCall> calls;
  calls.reserve(buckets.size());
  for (const NcclBuffer& b : buckets) {
    calls.push_back([b, op](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(b.data, b.data, b.count, b.dtype, op, comm, stream);
    });
  }
  return grouped(CollectiveKind::kAllReduce, calls, compute);
}

}  // namespace dstrain::comm
