#include "tests/common/thread_communicator.h"

#include <chrono>
#include <deque>
#include <exception>
#include <thread>

#include "core/error.h"

namespace dstrain::testing {

using comm::CollectiveKind;
using comm::ReduceOp;

struct Slot {
  bool issued = false;
  torch::Tensor output;
  torch::Tensor input;
  std::vector<int64_t> splits;  // all_to_all_v: the input's rows for each rank
};

struct PendingOp {
  CollectiveKind kind{};
  ReduceOp op{};
  int root = 0;
  std::vector<Slot> slots;
  int issued = 0;
  int waiting = 0;  // ranks that have called wait(): no rank reads a buffer before all have
  int read = 0;
  int done = 0;
  bool failed = false;  // a rank issued a mismatching call: every waiter fails at once
};

class ThreadGroup {
 public:
  ThreadGroup(int world_size, PointToPoint transfers)
      : world_size_(world_size), transfers_(transfers) {}
  int world_size() const { return world_size_; }
  PointToPoint transfers() const { return transfers_; }
  void issue(uint64_t seq, int rank, CollectiveKind kind, ReduceOp op, int root, Slot slot);
  void execute(uint64_t seq, int rank);
  // Point-to-point: `tensor` from rank `from` to rank `to` (a copy), and the oldest message from
  // `from` to `to`, waited for up to 30 s.
  // post() returns the message's number on its channel; taken() waits (30 s at most) until the
  // receiver has taken it.
  uint64_t post(int from, int to, const torch::Tensor& tensor);
  torch::Tensor take(int from, int to);
  void taken(int from, int to, uint64_t message);
  // Split number `index`: waits for every rank's color; returns the group of `color` and this
  // rank's place in it.
  std::pair<std::shared_ptr<ThreadGroup>, int> split(uint64_t index, int rank, int color);

 private:
  torch::Tensor compute(const PendingOp& op, int rank) const;
  // A peer that never arrives (a bug in the code under test) fails the test instead of hanging it.
  template <typename Pred>
  void wait_for(std::unique_lock<std::mutex>& lock, uint64_t seq, int rank, Pred ready) {
    auto done = [&] { return ops_[seq].failed || ready(); };
    if (!changed_.wait_for(lock, std::chrono::seconds(30), done)) {
      fail(ErrorKind::kTimeout, "collective #{} on rank {}: peers did not arrive in 30 s", seq,
           rank);
    }
    if (ops_[seq].failed) {
      fail(ErrorKind::kComm, "collective #{} on rank {}: the ranks' calls do not match", seq, rank);
    }
  }
  struct PendingSplit {
    std::vector<int> colors;
    int arrived = 0;
    std::map<int, std::shared_ptr<ThreadGroup>> groups;
  };
  int world_size_;
  PointToPoint transfers_;
  std::map<uint64_t, PendingSplit> splits_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<uint64_t, PendingOp> ops_;
  std::map<std::pair<int, int>, std::deque<torch::Tensor>> mailboxes_;  // by (from, to)
  std::map<std::pair<int, int>, uint64_t> posted_, taken_;              // messages, by channel
};

uint64_t ThreadGroup::post(int from, int to, const torch::Tensor& tensor) {
  std::lock_guard<std::mutex> lock(mutex_);
  mailboxes_[{from, to}].push_back(tensor.detach().clone());
  changed_.notify_all();
  return ++posted_[{from, to}];
}

torch::Tensor ThreadGroup::take(int from, int to) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto& box = mailboxes_[{from, to}];
  if (!changed_.wait_for(lock, std::chrono::seconds(30), [&] { return !box.empty(); })) {
    fail(ErrorKind::kTimeout, "recv from rank {} on rank {}: nothing arrived in 30 s", from, to);
  }
  torch::Tensor t = std::move(box.front());
  box.pop_front();
  ++taken_[{from, to}];
  changed_.notify_all();
  return t;
}

void ThreadGroup::taken(int from, int to, uint64_t message) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto done = [&] { return taken_[{from, to}] >= message; };
  if (!changed_.wait_for(lock, std::chrono::seconds(30), done)) {
    fail(ErrorKind::kTimeout, "send to rank {} on rank {}: not received in 30 s", to, from);
  }
}

void ThreadGroup::issue(uint64_t seq, int rank, CollectiveKind kind, ReduceOp op, int root,
                        Slot slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  PendingOp& pending = ops_[seq];
  if (pending.slots.empty()) {
    pending.slots.resize(world_size_);
    pending.kind = kind;
    pending.op = op;
    pending.root = root;
  }
  const Slot* other = nullptr;
  for (const Slot& s : pending.slots) other = s.issued ? &s : other;
  const bool mismatch = pending.kind != kind || pending.op != op || pending.root != root ||
                        (other && other->input.defined() && slot.splits.empty() &&
                         (other->input.numel() != slot.input.numel() ||
                          other->input.scalar_type() != slot.input.scalar_type()));
  if (mismatch) {
    pending.failed = true;
    changed_.notify_all();
    fail(ErrorKind::kComm,
         "collective #{} on rank {}: kind {} does not match the other ranks' call", seq, rank,
         static_cast<int>(kind));
  }
  slot.issued = true;
  pending.slots[rank] = std::move(slot);
  ++pending.issued;
  changed_.notify_all();
}

// Two rendezvous: all waiting → each reads all inputs into a private result; all read → each
// writes its output (in-place all_reduce reads peers' tensors that the peers will overwrite).
// Reading only once every rank is inside wait() makes a buffer changed between a collective's
// call and its wait() always count, on every rank, whatever the threads' timing.
void ThreadGroup::execute(uint64_t seq, int rank) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++ops_[seq].waiting;
  changed_.notify_all();
  wait_for(lock, seq, rank, [&] { return ops_[seq].waiting == world_size_; });
  PendingOp& op = ops_[seq];
  lock.unlock();
  torch::Tensor result = compute(op, rank);
  lock.lock();
  ++op.read;
  changed_.notify_all();
  wait_for(lock, seq, rank, [&] { return op.read == world_size_; });
  lock.unlock();
  if (result.defined()) op.slots[rank].output.copy_(result);
  lock.lock();
  if (++op.done == world_size_) ops_.erase(seq);
}

std::pair<std::shared_ptr<ThreadGroup>, int> ThreadGroup::split(uint64_t index, int rank,
                                                                int color) {
  std::unique_lock<std::mutex> lock(mutex_);
  PendingSplit& pending = splits_[index];
  if (pending.colors.empty()) pending.colors.assign(world_size_, -1);
  pending.colors[rank] = color;
  ++pending.arrived;
  changed_.notify_all();
  if (!changed_.wait_for(lock, std::chrono::seconds(30),
                         [&] { return pending.arrived == world_size_; })) {
    fail(ErrorKind::kTimeout, "split #{} on rank {}: peers did not arrive in 30 s", index, rank);
  }
  if (color == comm::kNoGroup) return {std::make_shared<ThreadGroup>(1, transfers_), 0};
  int size = 0, place = 0;
  for (int r = 0; r < world_size_; ++r) {
    if (pending.colors[r] != color) continue;
    if (r == rank) place = size;
    ++size;
  }
  auto& group = pending.groups[color];
  if (!group) group = std::make_shared<ThreadGroup>(size, transfers_);
  return {group, place};
}

torch::Tensor ThreadGroup::compute(const PendingOp& op, int rank) const {
  const int n = world_size_;
  auto reduce = [&](int64_t begin, int64_t count) {
    torch::Tensor acc;
    for (const Slot& s : op.slots) {
      torch::Tensor part = s.input.reshape({-1}).narrow(0, begin, count).to(torch::kFloat64);
      acc = !acc.defined()            ? part.clone()
            : op.op == ReduceOp::kMax ? torch::maximum(acc, part)
                                      : acc + part;
    }
    if (op.op == ReduceOp::kAvg) acc /= n;
    return acc;
  };
  const Slot& mine = op.slots[rank];
  switch (op.kind) {
    case CollectiveKind::kAllReduce:
      return reduce(0, mine.input.numel()).view(mine.output.sizes());
    case CollectiveKind::kReduceScatter: {
      const int64_t chunk = mine.output.numel();
      return reduce(rank * chunk, chunk).view(mine.output.sizes());
    }
    case CollectiveKind::kAllGather: {
      std::vector<torch::Tensor> parts;
      for (const Slot& s : op.slots) parts.push_back(s.input.reshape({-1}).clone());
      return torch::cat(parts).view(mine.output.sizes());
    }
    case CollectiveKind::kBroadcast:
      return op.slots[op.root].input.clone();
    case CollectiveKind::kBarrier:
      return {};
    case CollectiveKind::kAllToAll: {
      if (!mine.splits.empty()) {
        std::vector<torch::Tensor> parts;
        for (const Slot& s : op.slots) {
          int64_t begin = 0;
          for (int j = 0; j < rank; ++j) begin += s.splits[j];
          parts.push_back(s.input.narrow(0, begin, s.splits[rank]));
        }
        return torch::cat(parts).view(mine.output.sizes());
      }
      const int64_t chunk = mine.output.numel() / n;
      std::vector<torch::Tensor> parts;
      for (const Slot& s : op.slots)
        parts.push_back(s.input.reshape({-1}).narrow(0, rank * chunk, chunk));
      return torch::cat(parts).view(mine.output.sizes());
    }
    case CollectiveKind::kSend:
    case CollectiveKind::kRecv:
      break;  // not collectives: exchange() posts and takes them
  }
  return {};
}

namespace {

class ThreadWork : public comm::Work {
 public:
  ThreadWork(std::shared_ptr<ThreadGroup> group, uint64_t seq, int rank)
      : group_(std::move(group)), seq_(seq), rank_(rank) {}
  ~ThreadWork() override {
    try {
      wait();
    } catch (const std::exception&) {
      // The header's contract: errors of an abandoned handle are logged, not thrown.
    }
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    group_->execute(seq_, rank_);
  }

 private:
  std::shared_ptr<ThreadGroup> group_;
  uint64_t seq_;
  int rank_;
  bool waited_ = false;
};

uint64_t bytes_of(const torch::Tensor& t) {
  return static_cast<uint64_t>(t.nbytes());
}

// Receives in wait(); the sends were delivered when issued.
class ThreadPeerWork : public comm::Work {
 public:
  ThreadPeerWork(std::shared_ptr<ThreadGroup> group, std::vector<comm::PeerTransfer> receives,
                 int rank)
      : group_(std::move(group)), receives_(std::move(receives)), rank_(rank) {}
  void wait() override {
    if (waited_) return;
    waited_ = true;
    for (comm::PeerTransfer& r : receives_) {
      const torch::Tensor got = group_->take(r.peer, rank_);
      if (got.sizes() != r.tensor.sizes() || got.scalar_type() != r.tensor.scalar_type()) {
        fail(ErrorKind::kComm, "recv from rank {} on rank {}: {} {} sent, {} {} expected", r.peer,
             rank_, c10::toString(got.scalar_type()), got.numel(),
             c10::toString(r.tensor.scalar_type()), r.tensor.numel());
      }
      r.tensor.copy_(got);
    }
  }

 private:
  std::shared_ptr<ThreadGroup> group_;
  std::vector<comm::PeerTransfer> receives_;
  int rank_;
  bool waited_ = false;
};

}  // namespace

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}

int ThreadCommunicator::world_size() const {
  return group_->world_size();
}

std::unique_ptr<comm::Work> ThreadCommunicator::issue(CollectiveKind kind, torch::Tensor output,
                                                      torch::Tensor input, ReduceOp op, int root,
                                                      std::vector<int64_t> splits) {
  const uint64_t seq = next_seq_++;
  group_->issue(seq, rank_, kind, op, root,
                Slot{false, std::move(output), std::move(input), std::move(splits)});
  return std::make_unique<ThreadWork>(group_, seq, rank_);
}

std::unique_ptr<comm::Work> ThreadCommunicator::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  const uint64_t n = world_size();
  count(CollectiveKind::kAllReduce, 2 * (n - 1) * bytes_of(tensor) / n);
  return issue(CollectiveKind::kAllReduce, tensor, tensor, op, 0);
}

std::unique_ptr<comm::Work> ThreadCommunicator::reduce_scatter(torch::Tensor& output,
                                                               const torch::Tensor& input,
                                                               ReduceOp op) {
  const uint64_t n = world_size();
  if (input.numel() != output.numel() * world_size() || !output.is_contiguous()) {
    fail(ErrorKind::kInternal, "reduce_scatter: input numel {} != {} x output numel {}",
         input.numel(), n, output.numel());
  }
  count(CollectiveKind::kReduceScatter, (n - 1) * bytes_of(input) / n);
  return issue(CollectiveKind::kReduceScatter, output, input, op, 0);
}

std::unique_ptr<comm::Work> ThreadCommunicator::all_gather(torch::Tensor& output,
                                                           const torch::Tensor& input) {
  const uint64_t n = world_size();
  if (output.numel() != input.numel() * world_size() || !output.is_contiguous()) {
    fail(ErrorKind::kInternal, "all_gather: output numel {} != {} x input numel {}", output.numel(),
         n, input.numel());
  }
  count(CollectiveKind::kAllGather, (n - 1) * bytes_of(output) / n);
  return issue(CollectiveKind::kAllGather, output, input, ReduceOp::kSum, 0);
}

std::unique_ptr<comm::Work> ThreadCommunicator::broadcast(torch::Tensor& tensor, int root) {
  count(CollectiveKind::kBroadcast, rank_ == root ? bytes_of(tensor) : 0);
  return issue(CollectiveKind::kBroadcast, tensor, tensor, ReduceOp::kSum, root);
}

void ThreadCommunicator::barrier() {
  count(CollectiveKind::kBarrier, 0);
  issue(CollectiveKind::kBarrier, {}, {}, ReduceOp::kSum, 0)->wait();
}

std::unique_ptr<comm::Work> ThreadCommunicator::all_to_all(torch::Tensor& output,
                                                           const torch::Tensor& input) {
  const uint64_t n = world_size();
  comm::check_all_to_all_shapes(output, input, world_size());
  if (!output.is_contiguous()) fail(ErrorKind::kInternal, "all_to_all: output not contiguous");
  count(CollectiveKind::kAllToAll, (n - 1) * bytes_of(input) / n);
  return issue(CollectiveKind::kAllToAll, output, input, ReduceOp::kSum, 0);
}

std::unique_ptr<comm::Work> ThreadCommunicator::all_to_all_v(torch::Tensor& output,
                                                             const torch::Tensor& input,
                                                             std::vector<int64_t> output_splits,
                                                             std::vector<int64_t> input_splits) {
  comm::check_all_to_all_v_shapes(output, input, output_splits, input_splits, world_size());
  count(CollectiveKind::kAllToAll, comm::all_to_all_v_bytes(input, input_splits, rank_));
  return issue(CollectiveKind::kAllToAll, output, input, ReduceOp::kSum, 0,
               std::move(input_splits));
}

std::unique_ptr<comm::Work> ThreadCommunicator::exchange(
    std::vector<comm::PeerTransfer> transfers) {
  comm::check_peer_transfers(transfers, rank_, world_size());
  std::vector<comm::PeerTransfer> receives;
  std::vector<std::pair<int, uint64_t>> sent;  // peer, message
  for (comm::PeerTransfer& t : transfers) {
    const bool sending = t.kind == CollectiveKind::kSend;
    count(t.kind, sending ? bytes_of(t.tensor) : 0);
    if (sending) {
      sent.emplace_back(t.peer, group_->post(rank_, t.peer, t.tensor));
    } else {
      receives.push_back(std::move(t));
    }
  }
  auto work = std::make_unique<ThreadPeerWork>(group_, std::move(receives), rank_);
  if (group_->transfers() == PointToPoint::kRendezvous) {
    work->wait();
    for (const auto& [peer, message] : sent) group_->taken(rank_, peer, message);
  }
  return work;
}

std::unique_ptr<comm::Communicator> ThreadCommunicator::split(int color) {
  comm::check_split_color(color);
  auto [group, rank] = group_->split(next_split_++, rank_, color);
  return std::make_unique<ThreadCommunicator>(std::move(group), rank);
}

void run_ranks(int world_size, const std::function<void(ThreadCommunicator&)>& body,
               PointToPoint transfers) {
  auto group = std::make_shared<ThreadGroup>(world_size, transfers);
  std::vector<std::exception_ptr> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        ThreadCommunicator comm(group, r);
        body(comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace dstrain::testing
