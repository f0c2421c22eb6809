// GlooCommunicator: every collective is a job on one SerialExecutor thread, so collectives reach
// Gloo in program order on every rank and the caller can overlap them with compute. all_reduce,
// all_gather, broadcast and barrier are ProcessGroupGloo's own; reduce_scatter is a ring over its
// send/recv (ring.h). Byte counters are charged at issue time, from the algorithm's
// theory.

#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1  // LibTorch builds with Gloo define it; the header needs it
#endif
#include "comm/gloo_communicator.h"

#include <algorithm>
#include <cstdlib>
#include <functional>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
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

// A batch of transfers: issued on the executor thread (in program order with the collectives,
// without blocking it, so that the executor can go on to the next batch or collective), waited on
// by the caller, each transfer up to the timeout.
class PeerWork : public Work {
 public:
  using Issued = std::vector<c10::intrusive_ptr<c10d::Work>>;
  PeerWork(std::shared_future<void> issued_future, std::shared_ptr<Issued> issued,
           CollectiveKind kind, uint64_t seq, std::shared_ptr<const FailureContext> context,
           std::string what)
      : future_(std::move(issued_future)),
        issued_(std::move(issued)),
        kind_(kind),
        seq_(seq),
        context_(std::move(context)),
        what_(std::move(what)) {}
  ~PeerWork() override {
    try {
      wait();
    } catch (const std::exception& e) {
      log::error("{} was never waited on and failed: {}", what_, e.what());
    }
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    try {
      future_.get();
      for (const auto& work : *issued_) work->wait(context_->timeout);
    } catch (...) {
      throw_collective_error(kind_, seq_, *context_, std::current_exception(), what_);
    }
  }

 private:
  std::shared_future<void> future_;
  std::shared_ptr<Issued> issued_;
  CollectiveKind kind_;
  uint64_t seq_;
  std::shared_ptr<const FailureContext> context_;
  std::string what_;
  bool waited_ = false;
};

// The tag of every transfer: a slot of its own beside the ring's tags (take_ring_tags), in which
// Gloo delivers a pair's messages in the order sent.
constexpr int kPeerTag = (1 << 30) + 1;

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

// What the world and its sub-communicators (split) share: the store, the failure context (errors
// and the heartbeat speak of world ranks), the one executor thread (so each rank issues every
// group's collectives in its program order: no two groups can wait on each other in different
// orders on different ranks) and the count of collectives launched (the heartbeat's numbering).
struct GlooShared {
  RendezvousOptions options;
  c10::intrusive_ptr<c10d::TCPStore> store;
  std::shared_ptr<FailureContext> context;
  std::unique_ptr<SerialExecutor> executor;
  uint64_t issued = 0;  // collectives launched so far: the next one's number is issued + 1
};

class GlooCommunicator : public Communicator {
 public:
  explicit GlooCommunicator(const RendezvousOptions& options);
  // A sub-communicator over `group` (null for a group of one), keys under `prefix` in the store.
  GlooCommunicator(std::shared_ptr<GlooShared> shared,
                   c10::intrusive_ptr<c10d::ProcessGroupGloo> group, int rank, int size,
                   std::string prefix);
  ~GlooCommunicator() override;
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
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
  int world_rank(int rank) const {
    return world_ranks_.empty() ? rank : world_ranks_.at(static_cast<size_t>(rank));
  }
  std::unique_ptr<Work> launch(CollectiveKind kind, uint64_t bytes, std::function<void()> job);
  int take_ring_tags();

  std::shared_ptr<GlooShared> shared_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;  // null in a world of one
  int rank_ = 0;
  int size_ = 1;
  bool is_world_ = true;
  std::string prefix_;            // store keys of this communicator's splits
  std::vector<int> world_ranks_;  // of each of its ranks; empty: the world's own
  int splits_ = 0;
  int next_tag_ = 0;
};

c10::intrusive_ptr<c10d::ProcessGroupGloo> make_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int size,
                                                      const RendezvousOptions& options) {
  auto group_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  try {
    group_options->devices.push_back(make_device(options));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, group_options);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string why = e.what();
    fail(ErrorKind::kComm, "rank {} could not connect to its peers through Gloo: {}", options.rank,
         why.substr(0, why.find('\n')));
  }
}

GlooCommunicator::GlooCommunicator(const RendezvousOptions& options)
    : shared_(std::make_shared<GlooShared>()),
      rank_(options.rank),
      size_(options.world_size),
      prefix_("dstrain/split/") {
  shared_->options = options;
  shared_->context = std::make_shared<FailureContext>();
  FailureContext& context = *shared_->context;
  context.rank = options.rank;
  context.world_size = options.world_size;
  context.timeout = options.timeout;
  if (options.world_size > 1) {
    shared_->store = rendezvous(options);
    context.heartbeat = std::make_shared<Heartbeat>(options, kHeartbeatInterval);
    group_ = make_group(shared_->store, options.rank, options.world_size, options);
  }
  shared_->executor = std::make_unique<SerialExecutor>();
  shared_->executor->submit([] { trace::name_thread("comm"); });
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<GlooShared> shared,
                                   c10::intrusive_ptr<c10d::ProcessGroupGloo> group, int rank,
                                   int size, std::string prefix)
    : shared_(std::move(shared)),
      group_(std::move(group)),
      rank_(rank),
      size_(size),
      is_world_(false),
      prefix_(std::move(prefix)) {}

// The world's group goes first, so peers still in a collective with this rank fail at once; then
// the heartbeat says this rank left on purpose (and rank 0 keeps the store up for peers still
// diagnosing); the store goes last. A sub-communicator's queued jobs hold its group themselves.
GlooCommunicator::~GlooCommunicator() {
  if (!is_world_) return;
  shared_->executor.reset();
  group_.reset();
  if (shared_->context->heartbeat) shared_->context->heartbeat->leave();
}

std::unique_ptr<Communicator> GlooCommunicator::split(int color) {
  check_split_color(color);
  const std::string prefix = fmt::format("{}{}/", prefix_, splits_++);
  std::vector<int> members{rank_};
  if (size_ > 1) members = split_members(*shared_->store, prefix, rank_, size_, color);
  if (color == kNoGroup) members = {rank_};
  const int rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  const int size = static_cast<int>(members.size());
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
  const std::string group_prefix = fmt::format("{}group/{}/", prefix, color);
  if (size > 1) {
    auto store = c10::make_intrusive<c10d::PrefixStore>(group_prefix, shared_->store);
    group = make_group(store, rank, size, shared_->options);
  }
  auto sub =
      std::make_unique<GlooCommunicator>(shared_, std::move(group), rank, size, group_prefix);
  for (const int member : members) sub->world_ranks_.push_back(world_rank(member));
  return sub;
}

std::unique_ptr<Work> GlooCommunicator::launch(CollectiveKind kind, uint64_t bytes,
                                               std::function<void()> job) {
  count(kind, bytes);
  const uint64_t seq = ++shared_->issued;
  // The span is the collective's own run on the executor thread, labelled by what launched it (a
  // gradient bucket, a stage-3 unit): set against the main thread's spans it shows the overlap.
  auto traced = [job = std::move(job), kind, label = trace::current_label(),
                 size = static_cast<int64_t>(bytes), heartbeat = shared_->context->heartbeat, seq] {
    if (heartbeat) heartbeat->entered(seq);
    const trace::Span span("comm", to_string(kind), label, {"bytes_sent", size});
    job();
  };
  return std::make_unique<FutureWork>(shared_->executor->submit(std::move(traced)), kind, seq,
                                      shared_->context);
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

std::unique_ptr<Work> GlooCommunicator::all_to_all(torch::Tensor& output,
                                                   const torch::Tensor& input) {
  const auto kind = CollectiveKind::kAllToAll;
  const int n = world_size();
  check_buffer(kind, "output", output);
  check_buffer(kind, "input", input);
  check_all_to_all_shapes(output, input, n);
  const uint64_t bytes = ring_pass_bytes(n, input.numel() * input.element_size());
  return launch(kind, bytes, [group = group_, output, input, n] {
    if (n == 1) {
      if (!output.is_same(input)) output.copy_(input);
      return;
    }
    at::Tensor out = output;
    at::Tensor in = input;
    std::vector<int64_t> equal_splits;  // empty: equal chunks
    group->alltoall_base(out, in, equal_splits, equal_splits)->wait();
  });
}

// Gloo's all-to-all with split sizes (ProcessGroupGloo::alltoall_base; its list form is not
// implemented), on the rows' bytes so that every dtype goes as it is.
std::unique_ptr<Work> GlooCommunicator::all_to_all_v(torch::Tensor& output,
                                                     const torch::Tensor& input,
                                                     std::vector<int64_t> output_splits,
                                                     std::vector<int64_t> input_splits) {
  const auto kind = CollectiveKind::kAllToAll;
  const int n = world_size();
  check_buffer(kind, "output", output);
  check_buffer(kind, "input", input);
  check_all_to_all_v_shapes(output, input, output_splits, input_splits, n);
  const uint64_t bytes = all_to_all_v_bytes(input, input_splits, rank_);
  return launch(kind, bytes,
                [group = group_, output, input, n, out_splits = std::move(output_splits),
                 in_splits = std::move(input_splits)]() mutable {
                  if (n == 1) {
                    if (!output.is_same(input)) output.copy_(input);
                    return;
                  }
                  const auto as_rows = [](const at::Tensor& t) {
                    int64_t row = t.element_size();
                    for (int64_t d = 1; d < t.dim(); ++d) row *= t.size(d);
                    return t.view({-1}).view(at::kByte).view({t.size(0), row});
                  };
                  at::Tensor out = as_rows(output);
                  at::Tensor in = as_rows(input);
                  group->alltoall_base(out, in, out_splits, in_splits)->wait();
                });
}

std::unique_ptr<Work> GlooCommunicator::exchange(std::vector<PeerTransfer> transfers) {
  check_peer_transfers(transfers, rank_, size_);
  for (const PeerTransfer& t : transfers) {
    if (!t.tensor.is_cpu()) {
      fail(ErrorKind::kInternal, "{} with rank {}: Gloo moves CPU tensors", to_string(t.kind),
           t.peer);
    }
    const bool sending = t.kind == CollectiveKind::kSend;
    count(t.kind, sending ? static_cast<uint64_t>(t.tensor.numel()) * t.tensor.element_size() : 0);
  }
  const std::string what =
      describe_transfers(transfers, [this](int rank) { return world_rank(rank); });
  auto issued = std::make_shared<PeerWork::Issued>();
  auto job = [group = group_, transfers, issued] {
    for (const PeerTransfer& t : transfers) {
      // Bytes are bytes: moving them as uint8 works for every dtype, bfloat16 included.
      std::vector<at::Tensor> tensors{t.tensor.view(at::kByte)};
      issued->push_back(t.kind == CollectiveKind::kSend ? group->send(tensors, t.peer, kPeerTag)
                                                        : group->recv(tensors, t.peer, kPeerTag));
    }
  };
  const CollectiveKind kind = transfers.front().kind;
  return std::make_unique<PeerWork>(shared_->executor->submit(std::move(job)), std::move(issued),
                                    kind, shared_->issued, shared_->context, what);
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
