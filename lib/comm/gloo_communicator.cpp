// GlooCommunicator: every collective is a job on one SerialExecutor thread, so collectives reach
// Gloo in program order on every rank and the caller can overlap them with compute. all_reduce,
// all_gather, broadcast and barrier are ProcessGroupGloo's own; reduce_scatter is a ring over its
// send/recv (ring.h). Byte counters are charged at issue time, from the algorithm's
// theory.

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1  // LibTorch builds with Gloo define it; the header needs it
#endif
#include "comm/gloo_communicator.h"

#include <cstdlib>
#include <functional>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "comm/collective_error.h"
#include "comm/heartbeat.h"
#include "comm/rendezvous.h"
#include "comm/ring.h"
#include "comm/serial_executor.h"
#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"

namespace dstrain::comm {
namespace {

constexpr std::chrono::milliseconds kHeartbeatInterval{500};

class FutureWork : public Work {
 public:
  FutureWork(std::shared_future<void> future, CollectiveKind kind, uint64_t seq,
             std::shared_ptr<const FailureContext> context)
      : future_(std::move(future)), kind_(kind), seq_(seq), context_(std::move(context)) {}
  ~FutureWork() override {
    try {
      wait();
    } catch (const std::exception& e) {
      log::error("{} was never waited on and failed: {}", to_string(kind_), e.what());
    }
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    try {
      future_.get();
    } catch (...) {
      throw_collective_error(kind_, seq_, *context_, std::current_exception());
    }
  }

 private:
  std::shared_future<void> future_;
  CollectiveKind kind_;
  uint64_t seq_;
  std::shared_ptr<const FailureContext> context_;
  bool waited_ = false;
};

void check_buffer(CollectiveKind kind, const char* name, const at::Tensor& t) {
  if (!t.defined() || !t.is_cpu() || !t.is_contiguous() || !at::isFloatingType(t.scalar_type())) {
    fail(ErrorKind::kInternal, "{}: {} must be a contiguous CPU floating-point tensor",
         to_string(kind), name);
  }
}

void check_pair(CollectiveKind kind, const at::Tensor& small, const at::Tensor& large, int n) {
  check_buffer(kind, "output", kind == CollectiveKind::kReduceScatter ? small : large);
  check_buffer(kind, "input", kind == CollectiveKind::kReduceScatter ? large : small);
  if (small.scalar_type() != large.scalar_type() || large.numel() != small.numel() * n) {
    fail(ErrorKind::kInternal,
         "{}: expected the large buffer to hold {} x {} {} elements, got {} {}", to_string(kind), n,
         small.numel(), c10::toString(small.scalar_type()), large.numel(),
         c10::toString(large.scalar_type()));
  }
}

// Bytes this rank sends in a ring pass over a buffer of `total_bytes`: (N-1)/N of it.
uint64_t ring_pass_bytes(int n, uint64_t total_bytes) {
  return total_bytes / n * (n - 1);
}

std::shared_ptr<gloo::transport::Device> make_device(const RendezvousOptions& options) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  const std::string& addr = options.master_addr;
  if (addr == "localhost" || addr.rfind("127.", 0) == 0) {
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

class GlooCommunicator : public Communicator {
 public:
  explicit GlooCommunicator(const RendezvousOptions& options);
  ~GlooCommunicator() override;
  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->world_size; }
  std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                       ReduceOp op) override;
  std::unique_ptr<Work> all_gather(torch::Tensor& output, const torch::Tensor& input) override;
  std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) override;
  void barrier() override;

 private:
  std::unique_ptr<Work> launch(CollectiveKind kind, uint64_t bytes, std::function<void()> job);
  int take_ring_tags();

  // Declaration order is teardown order reversed: the executor stops before the group goes.
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::shared_ptr<FailureContext> context_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  std::unique_ptr<SerialExecutor> executor_;
  int next_tag_ = 0;
  uint64_t issued_ = 0;  // collectives launched so far: the next one's number is issued_ + 1
};

GlooCommunicator::GlooCommunicator(const RendezvousOptions& options)
    : context_(std::make_shared<FailureContext>()) {
  context_->rank = options.rank;
  context_->world_size = options.world_size;
  context_->timeout = options.timeout;
  if (options.world_size > 1) {
    store_ = rendezvous(options);
    context_->heartbeat = std::make_shared<Heartbeat>(options, kHeartbeatInterval);
    auto group_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    try {
      group_options->devices.push_back(make_device(options));
      group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, options.rank, options.world_size,
                                                           group_options);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      std::string why = e.what();
      fail(ErrorKind::kComm, "rank {} could not connect to its peers through Gloo: {}",
           options.rank, why.substr(0, why.find('\n')));
    }
  }
  executor_ = std::make_unique<SerialExecutor>();
  executor_->submit([] { trace::name_thread("comm"); });
}

// The group goes first, so peers still in a collective with this rank fail at once; then the
// heartbeat says this rank left on purpose (and rank 0 keeps the store up for peers still
// diagnosing); the store goes last.
GlooCommunicator::~GlooCommunicator() {
  executor_.reset();
  group_.reset();
  if (context_->heartbeat) context_->heartbeat->leave();
}

std::unique_ptr<Work> GlooCommunicator::launch(CollectiveKind kind, uint64_t bytes,
                                               std::function<void()> job) {
  count(kind, bytes);
  const uint64_t seq = ++issued_;
  // The span is the collective's own run on the executor thread, labelled by what launched it (a
  // gradient bucket, a stage-3 unit): set against the main thread's spans it shows the overlap.
  auto traced = [job = std::move(job), kind, label = trace::current_label(),
                 size = static_cast<int64_t>(bytes), heartbeat = context_->heartbeat, seq] {
    if (heartbeat) heartbeat->entered(seq);
    const trace::Span span("comm", to_string(kind), label, {"bytes_sent", size});
    job();
  };
  return std::make_unique<FutureWork>(executor_->submit(std::move(traced)), kind, seq, context_);
}

int GlooCommunicator::take_ring_tags() {
  int tag = next_tag_;
  next_tag_ = (next_tag_ + world_size()) % (1 << 30);
  return tag;
}

std::unique_ptr<Work> GlooCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  check_buffer(CollectiveKind::kAllReduce, "tensor", tensor);
  const int n = world_size();
  const uint64_t bytes = 2 * ring_pass_bytes(n, tensor.numel() * tensor.element_size());
  return launch(CollectiveKind::kAllReduce, bytes, [group = group_, tensor, op, n] {
    if (n == 1) return;
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = op == ReduceOp::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    group->allreduce(tensors, options)->wait();
    if (op == ReduceOp::kAvg) tensor.div_(n);
  });
}

std::unique_ptr<Work> GlooCommunicator::reduce_scatter(torch::Tensor& output,
                                                       const torch::Tensor& input, ReduceOp op) {
  const int n = world_size();
  check_pair(CollectiveKind::kReduceScatter, output, input, n);
  const uint64_t bytes = ring_pass_bytes(n, input.numel() * input.element_size());
  const int tag = n > 1 ? take_ring_tags() : 0;
  return launch(CollectiveKind::kReduceScatter, bytes, [group = group_, output, input, op, n, tag] {
    if (n == 1) {
      if (!output.is_same(input)) output.copy_(input);
      return;
    }
    ring_reduce_scatter(*group, output, input, op, tag);
    if (op == ReduceOp::kAvg) output.div_(n);
  });
}

std::unique_ptr<Work> GlooCommunicator::all_gather(torch::Tensor& output,
                                                   const torch::Tensor& input) {
  const int n = world_size();
  check_pair(CollectiveKind::kAllGather, input, output, n);
  const uint64_t bytes = ring_pass_bytes(n, output.numel() * output.element_size());
  return launch(CollectiveKind::kAllGather, bytes, [group = group_, output, input, n] {
    if (n == 1) {
      if (!output.is_same(input)) output.copy_(input);
      return;
    }
    at::Tensor out = output;
    at::Tensor in = input;
    group->_allgather_base(out, in)->wait();
  });
}

std::unique_ptr<Work> GlooCommunicator::broadcast(torch::Tensor& tensor, int root) {
  check_buffer(CollectiveKind::kBroadcast, "tensor", tensor);
  const int n = world_size();
  if (root < 0 || root >= n) {
    fail(ErrorKind::kInternal, "broadcast: root {} is not a rank of a world of {}", root, n);
  }
  // Accounting model: the root sends the whole buffer to each peer.
  const uint64_t bytes =
      rank() == root ? uint64_t(n - 1) * tensor.numel() * tensor.element_size() : 0;
  return launch(CollectiveKind::kBroadcast, bytes, [group = group_, tensor, root, n] {
    if (n == 1) return;
    // Bytes are bytes: moving them as uint8 works for every dtype, bfloat16 included.
    std::vector<at::Tensor> tensors{tensor.view(at::kByte)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group->broadcast(tensors, options)->wait();
  });
}

void GlooCommunicator::barrier() {
  const int n = world_size();
  launch(CollectiveKind::kBarrier, 0, [group = group_, n] {
    if (n > 1) group->barrier()->wait();
  })->wait();
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const RendezvousOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    fail(ErrorKind::kUsage, "rank {} is not valid in a world of size {}", options.rank,
         options.world_size);
  }
  return std::make_unique<GlooCommunicator>(options);
}

}  // namespace dstrain::comm
