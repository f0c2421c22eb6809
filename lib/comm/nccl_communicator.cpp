// NcclCommunicator: torch::Tensor → NcclGroup. Rendezvous and unique-id exchange go through the
// same TCPStore as the Gloo communicator; after that the store only stays open for the job.

#include "comm/nccl_communicator.h"

#include <algorithm>

#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "comm/nccl_check.h"
#include "comm/nccl_dtype.h"
#include "comm/nccl_group.h"
#include "comm/nccl_rendezvous.h"
#include "comm/rendezvous.h"
#include "core/error.h"
#include "core/log.h"

namespace dstrain::comm {
namespace {

StreamProvider default_stream(int device) {
#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
  return [device] {
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  };
#else
  return [] { return cudaStreamLegacy; };
#endif
}

// Keeps the tensors alive while the collective may still read or write them.
class NcclTensorWork : public Work {
 public:
  NcclTensorWork(std::unique_ptr<NcclWork> work, std::vector<at::Tensor> tensors,
                 StreamProvider stream)
      : work_(std::move(work)), tensors_(std::move(tensors)), stream_(std::move(stream)) {}
  ~NcclTensorWork() override {
    try {
      wait();
    } catch (const std::exception& e) {
      log::error("{} was never waited on and failed: {}", to_string(work_->kind()), e.what());
    }
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    work_->wait(stream_());
  }
  void synchronize_host() {
    waited_ = true;
    work_->synchronize();
  }

 private:
  std::unique_ptr<NcclWork> work_;
  std::vector<at::Tensor> tensors_;
  StreamProvider stream_;
  bool waited_ = false;
};

uint64_t bytes_of(const at::Tensor& t) {
  return static_cast<uint64_t>(t.numel()) * t.element_size();
}

class NcclCommunicator : public Communicator {
 public:
  // `prefix`: where this communicator's splits keep their keys in the store.
  NcclCommunicator(c10::intrusive_ptr<c10d::TCPStore> store, std::unique_ptr<NcclGroup> group,
                   StreamProvider stream, std::string prefix = "dstrain/split/")
      : store_(std::move(store)),
        group_(std::move(group)),
        stream_(std::move(stream)),
        prefix_(std::move(prefix)) {
    if (!stream_) stream_ = default_stream(group_->device());
  }
  ~NcclCommunicator() override {
    if (barrier_buffer_ != nullptr) cudaFree(barrier_buffer_);
  }
  int rank() const override { return group_->rank(); }
  int world_size() const override { return group_->world_size(); }
  std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                       ReduceOp op) override;
  std::unique_ptr<Work> all_gather(torch::Tensor& output, const torch::Tensor& input) override;
  std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) override;
  void barrier() override;
  std::unique_ptr<Work> all_to_all(torch::Tensor& output, const torch::Tensor& input) override;
  std::unique_ptr<Work> all_to_all_v(torch::Tensor& output, const torch::Tensor& input,
                                     std::vector<int64_t> output_splits,
                                     std::vector<int64_t> input_splits) override;
  std::unique_ptr<Work> exchange(std::vector<PeerTransfer> transfers) override;
  std::unique_ptr<Communicator> split(int color) override;

 private:
  void check_pair(CollectiveKind kind, const at::Tensor& small, const at::Tensor& large) const;
  std::unique_ptr<Work> wrap(std::unique_ptr<NcclWork> work, std::vector<at::Tensor> tensors) {
    return std::make_unique<NcclTensorWork>(std::move(work), std::move(tensors), stream_);
  }

  c10::intrusive_ptr<c10d::TCPStore> store_;  // null in a world of one
  std::unique_ptr<NcclGroup> group_;
  StreamProvider stream_;
  std::string prefix_;
  int splits_ = 0;
  float* barrier_buffer_ = nullptr;
};

void NcclCommunicator::check_pair(CollectiveKind kind, const at::Tensor& small,
                                  const at::Tensor& large) const {
  const bool scatter = kind == CollectiveKind::kReduceScatter;
  check_cuda_buffer(kind, "output", scatter ? small : large, group_->device());
  check_cuda_buffer(kind, "input", scatter ? large : small, group_->device());
  if (small.scalar_type() != large.scalar_type() || large.numel() != small.numel() * world_size()) {
    fail(ErrorKind::kInternal,
         "{}: expected the large buffer to hold {} x {} {} elements, got {} {}", to_string(kind),
         world_size(), small.numel(), c10::toString(small.scalar_type()), large.numel(),
         c10::toString(large.scalar_type()));
  }
}

std::unique_ptr<Work> NcclCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  const auto kind = CollectiveKind::kAllReduce;
  check_cuda_buffer(kind, "tensor", tensor, group_->device());
  count(kind, 2 * ring_pass_bytes(world_size(), bytes_of(tensor)));
  auto work = group_->all_reduce(tensor.data_ptr(), tensor.numel(),
                                 nccl_dtype(kind, tensor.scalar_type()), nccl_op(op), stream_());
  return wrap(std::move(work), {tensor});
}

std::unique_ptr<Work> NcclCommunicator::reduce_scatter(torch::Tensor& output,
                                                       const torch::Tensor& input, ReduceOp op) {
  const auto kind = CollectiveKind::kReduceScatter;
  check_pair(kind, output, input);
  count(kind, ring_pass_bytes(world_size(), bytes_of(input)));
  auto work = group_->reduce_scatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                     nccl_dtype(kind, input.scalar_type()), nccl_op(op), stream_());
  return wrap(std::move(work), {output, input});
}

std::unique_ptr<Work> NcclCommunicator::all_gather(torch::Tensor& output,
                                                   const torch::Tensor& input) {
  const auto kind = CollectiveKind::kAllGather;
  check_pair(kind, input, output);
  count(kind, ring_pass_bytes(world_size(), bytes_of(output)));
  auto work = group_->all_gather(input.data_ptr(), output.data_ptr(), input.numel(),
                                 nccl_dtype(kind, input.scalar_type()), stream_());
  return wrap(std::move(work), {output, input});
}

std::unique_ptr<Work> NcclCommunicator::broadcast(torch::Tensor& tensor, int root) {
  const auto kind = CollectiveKind::kBroadcast;
  check_cuda_buffer(kind, "tensor", tensor, group_->device());
  const int n = world_size();
  if (root < 0 || root >= n) {
    fail(ErrorKind::kInternal, "broadcast: root {} is not a rank of a world of {}", root, n);
  }
  // Accounting model, as for Gloo: the root sends the whole buffer to each peer.
  count(kind, rank() == root ? uint64_t(n - 1) * bytes_of(tensor) : 0);
  // Bytes are bytes: moving them as uint8 works for every dtype.
  auto work = group_->broadcast(tensor.data_ptr(), bytes_of(tensor), ncclUint8, root, stream_());
  return wrap(std::move(work), {tensor});
}

// A one-element all_reduce, waited on by the host: every rank has reached this point.
void NcclCommunicator::barrier() {
  count(CollectiveKind::kBarrier, 0);
  if (world_size() == 1) return;
  if (barrier_buffer_ == nullptr) {
    check_cuda(cudaMalloc(&barrier_buffer_, sizeof(float)), rank(),
               "allocating the barrier buffer");
    check_cuda(cudaMemset(barrier_buffer_, 0, sizeof(float)), rank(),
               "clearing the barrier buffer");
  }
  group_
      ->grouped(CollectiveKind::kBarrier,
                {[buffer = barrier_buffer_](ncclComm_t comm, cudaStream_t stream) {
                  return ncclAllReduce(buffer, buffer, 1, ncclFloat32, ncclSum, comm, stream);
                }},
                stream_())
      ->synchronize();
}

std::unique_ptr<Work> NcclCommunicator::all_to_all(torch::Tensor& output,
                                                   const torch::Tensor& input) {
  const auto kind = CollectiveKind::kAllToAll;
  const int n = world_size();
  check_cuda_buffer(kind, "output", output, group_->device());
  check_cuda_buffer(kind, "input", input, group_->device());
  check_all_to_all_shapes(output, input, n);
  count(kind, ring_pass_bytes(n, bytes_of(input)));
  auto work = group_->all_to_all(
      input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel() / n),
      nccl_dtype(kind, input.scalar_type()), input.element_size(), stream_());
  return wrap(std::move(work), {output, input});
}

// One ncclSend and one ncclRecv of the rows' bytes per peer (itself included, as all_to_all), in
// one NCCL group.
std::unique_ptr<Work> NcclCommunicator::all_to_all_v(torch::Tensor& output,
                                                     const torch::Tensor& input,
                                                     std::vector<int64_t> output_splits,
                                                     std::vector<int64_t> input_splits) {
  const auto kind = CollectiveKind::kAllToAll;
  const int n = world_size();
  check_cuda_buffer(kind, "output", output, group_->device());
  check_cuda_buffer(kind, "input", input, group_->device());
  check_all_to_all_v_shapes(output, input, output_splits, input_splits, n);
  count(kind, all_to_all_v_bytes(input, input_splits, rank()));
  const size_t row = input.size(0) > 0
                         ? bytes_of(input) / input.size(0)
                         : (output.size(0) > 0 ? bytes_of(output) / output.size(0) : 0);
  std::vector<NcclCall> calls;
  auto* send = static_cast<const char*>(input.data_ptr());
  auto* recv = static_cast<char*>(output.data_ptr());
  for (int peer = 0; peer < n; ++peer) {
    const size_t out_bytes = static_cast<size_t>(output_splits[peer]) * row;
    const size_t in_bytes = static_cast<size_t>(input_splits[peer]) * row;
    calls.push_back([send, in_bytes, peer](ncclComm_t comm, cudaStream_t stream) {
      return ncclSend(send, in_bytes, ncclUint8, peer, comm, stream);
    });
    calls.push_back([recv, out_bytes, peer](ncclComm_t comm, cudaStream_t stream) {
      return ncclRecv(recv, out_bytes, ncclUint8, peer, comm, stream);
    });
    send += in_bytes;
    recv += out_bytes;
  }
  return wrap(group_->grouped(kind, calls, stream_()), {output, input});
}

// One ncclSend or ncclRecv of the tensor's bytes per transfer, all in one NCCL group (so that
// two ranks sending to each other do not wait on each other); the timeout is NcclWork's.
std::unique_ptr<Work> NcclCommunicator::exchange(std::vector<PeerTransfer> transfers) {
  check_peer_transfers(transfers, rank(), world_size());
  std::vector<NcclCall> calls;
  std::vector<at::Tensor> tensors;
  for (const PeerTransfer& t : transfers) {
    check_cuda_buffer(t.kind, "tensor", t.tensor, group_->device());
    const bool sending = t.kind == CollectiveKind::kSend;
    count(t.kind, sending ? bytes_of(t.tensor) : 0);
    void* data = t.tensor.data_ptr();
    const size_t bytes = bytes_of(t.tensor);
    const int peer = t.peer;
    calls.push_back([sending, data, bytes, peer](ncclComm_t comm, cudaStream_t stream) {
      return sending ? ncclSend(data, bytes, ncclUint8, peer, comm, stream)
                     : ncclRecv(data, bytes, ncclUint8, peer, comm, stream);
    });
    tensors.push_back(t.tensor);
  }
  return wrap(group_->grouped(transfers.front().kind, calls, stream_()), std::move(tensors));
}

// The members learn each other through the store (split_members), the new group's rank 0
// publishes a fresh NCCL unique id, and the members join it: a communicator of their own, on the
// same device and compute stream.
std::unique_ptr<Communicator> NcclCommunicator::split(int color) {
  check_split_color(color);
  const std::string prefix = fmt::format("{}{}/", prefix_, splits_++);
  std::vector<int> members{rank()};
  if (world_size() > 1) members = split_members(*store_, prefix, rank(), world_size(), color);
  if (color == kNoGroup) members = {rank()};
  NcclGroupOptions options;
  options.rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  options.world_size = static_cast<int>(members.size());
  options.device = group_->device();
  options.timeout = group_->timeout();
  const std::string group_prefix = fmt::format("{}group/{}/", prefix, color);
  const ncclUniqueId id =
      options.world_size == 1
          ? NcclGroup::new_unique_id()
          : exchange_unique_id(*store_, group_prefix + "nccl_id", options.rank, "the job's store");
  return std::make_unique<NcclCommunicator>(store_, std::make_unique<NcclGroup>(id, options),
                                            stream_, group_prefix);
}

}  // namespace

bool nccl_available() {
  return true;
}

std::unique_ptr<Communicator> make_nccl_communicator(const RendezvousOptions& options,
                                                     NcclCommunicatorOptions nccl_options) {
  NcclConnection connection = connect_nccl(options, nccl_options.device);
  return std::make_unique<NcclCommunicator>(std::move(connection.store),
                                            std::move(connection.group),
                                            std::move(nccl_options.compute_stream));
}

void synchronize(Work& work) {
  if (auto* nccl = dynamic_cast<NcclTensorWork*>(&work)) {
    nccl->synchronize_host();
  } else {
    work.wait();
  }
}

}  // namespace dstrain::comm
