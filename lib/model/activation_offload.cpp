#include "model/activation_offload.h"

#include <map>
#include <mutex>
#include <optional>

#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dstrain::model {

// One stored tensor. `host` holds the values (for a CPU tensor: the tensor itself); `fetched` is
// the copy on its way back to the device, set between a fetch and the load that takes it.
class ActivationOffload::Entry {
 public:
  Entry(std::shared_ptr<State> state, int64_t seq, c10::Device device)
      : state_(std::move(state)), seq_(seq), device_(device) {}
  ~Entry();
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;

  std::shared_ptr<State> state_;
  int64_t seq_;
  c10::Device device_;
  torch::Tensor host;     // same shape and dtype as the stored tensor
  torch::Tensor fetched;  // on device_, or undefined
#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
  at::cuda::CUDAEvent copied_out;  // on the side stream: host holds the values
  at::cuda::CUDAEvent copied_in;   // on the side stream: fetched holds the values
#endif
};

struct ActivationOffload::State {
  mutable std::mutex mutex;
  std::map<int64_t, std::weak_ptr<Entry>> live;  // by store order
  int64_t next_seq = 0;
  int64_t host_bytes = 0;
#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
  std::map<c10::DeviceIndex, c10::cuda::CUDAStream> side_streams;

  c10::cuda::CUDAStream side_stream(c10::DeviceIndex device) {
    auto it = side_streams.find(device);
    if (it == side_streams.end())
      it = side_streams.emplace(device, c10::cuda::getStreamFromPool(false, device)).first;
    return it->second;
  }
#endif
};

ActivationOffload::Entry::~Entry() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->live.erase(seq_);
  state_->host_bytes -= static_cast<int64_t>(host.nbytes());
}

namespace {

#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
// Copies `t` to pinned host memory on `side`, after the work already queued on the compute stream.
void copy_out_cuda(const torch::Tensor& t, ActivationOffload::Entry& e,
                   c10::cuda::CUDAStream side) {
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(t.device().index());
  at::cuda::CUDAEvent ready;
  ready.record(compute);
  ready.block(side);
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    e.host = torch::empty(t.sizes(), t.options().device(torch::kCPU).pinned_memory(true));
    e.host.copy_(t, /*non_blocking=*/true);
  }
  // The compute stream may free t before the copy has read it: keep its block until then.
  c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), side);
  e.copied_out.record(side);
}

// Starts the copy of e.host back to the device, on `side`, into memory of the compute stream.
void copy_in_cuda(ActivationOffload::Entry& e, c10::cuda::CUDAStream side) {
  const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(e.device_.index());
  e.fetched = torch::empty(e.host.sizes(), e.host.options().device(e.device_));
  at::cuda::CUDAEvent allocated;
  allocated.record(compute);
  allocated.block(side);
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    e.fetched.copy_(e.host, /*non_blocking=*/true);
  }
  // If the entry goes before the load, the block must not be reused while the copy writes it.
  c10::cuda::CUDACachingAllocator::recordStream(e.fetched.storage().data_ptr(), side);
  e.copied_in.record(side);
}
#endif

}  // namespace

ActivationOffload::ActivationOffload() : state_(std::make_shared<State>()) {}
ActivationOffload::~ActivationOffload() = default;

std::shared_ptr<ActivationOffload::Entry> ActivationOffload::store(const torch::Tensor& t) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  auto e = std::make_shared<Entry>(state_, state_->next_seq++, t.device());
  if (t.is_cpu()) {
    e->host = t.detach();
#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
  } else if (t.is_cuda()) {
    copy_out_cuda(t.detach(), *e, state_->side_stream(t.device().index()));
#endif
  } else {
    e->host = t.detach().to(torch::kCPU);
  }
  state_->host_bytes += static_cast<int64_t>(e->host.nbytes());
  state_->live[e->seq_] = e;
  return e;
}

torch::Tensor ActivationOffload::load(Entry& e) {
  if (e.device_.is_cpu()) return e.host;
#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
  if (e.device_.is_cuda()) {
    std::shared_ptr<Entry> previous;  // released after the lock: its destructor takes the lock
    std::lock_guard<std::mutex> lock(state_->mutex);
    const c10::cuda::CUDAStream side = state_->side_stream(e.device_.index());
    if (!e.fetched.defined()) copy_in_cuda(e, side);
    e.copied_in.block(c10::cuda::getCurrentCUDAStream(e.device_.index()));
    torch::Tensor out = std::move(e.fetched);
    e.fetched = torch::Tensor();
    // Fetch ahead: the entry stored just before this one is the one backward loads next.
    auto it = state_->live.find(e.seq_);
    if (it != state_->live.begin() && it != state_->live.end()) {
      previous = std::prev(it)->second.lock();
      if (previous && previous->device_ == e.device_ && !previous->fetched.defined()) {
        copy_in_cuda(*previous, side);
      }
    }
    return out;
  }
#endif
  return e.host.to(e.device_);
}

int64_t ActivationOffload::live_entries() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<int64_t>(state_->live.size());
}

int64_t ActivationOffload::live_host_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->host_bytes;
}

int64_t ActivationOffload::total_stored() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->next_seq;
}

std::vector<torch::Tensor> ActivationOffload::host_tensors() const {
  std::vector<std::shared_ptr<Entry>> entries;  // released after the lock (see load())
  std::vector<torch::Tensor> out;
  std::lock_guard<std::mutex> lock(state_->mutex);
  for (const auto& [seq, weak] : state_->live) {
    if (auto e = weak.lock()) {
      out.push_back(e->host);
      entries.push_back(std::move(e));
    }
  }
  return out;
}

}  // namespace dstrain::model
