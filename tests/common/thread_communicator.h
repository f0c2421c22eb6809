#pragma once
// An in-process Communicator for tests: N ranks are N threads of one process sharing a ThreadGroup.
//
// Semantics follow lib/comm/communicator.h exactly, deterministically: a collective is issued at
// the call (kind, size, dtype and order are checked against the other ranks: a mismatch is
// Error(kComm)), and executed in wait(): each rank waits until all ranks have called wait(), reads
// every rank's input, waits until all ranks have read, then writes its own output. Reading the
// buffers only once every rank waits makes a caller that modifies a buffer before wait() see wrong
// results every time, as it could with a real asynchronous backend. Reductions add in rank order in
// fp64 (so results do not depend on thread timing). Byte counters use the header's ring formulas;
// broadcast counts S on the root. split() waits for every rank's color and hands the ranks of one
// color a ThreadGroup of their own. Point-to-point transfers: a send leaves a copy of its tensor in
// the receiver's mailbox at once (buffered, unlike Gloo's and NCCL's, which wait for the
// receive); a receive takes the oldest message from its peer in wait() (30 s at most), of the
// same size and dtype or Error(kComm). With PointToPoint::kRendezvous (NCCL's semantics on one
// stream) exchange() itself runs its batch to the end: its sends and receives all posted, then
// every receive taken and every send taken by its receiver; a batch the peers never complete is
// Error(kTimeout) after 30 s, so a schedule that would hang on NCCL fails the test.

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/communicator.h"

namespace dstrain::testing {

class ThreadGroup;

enum class PointToPoint { kBuffered, kRendezvous };

class ThreadCommunicator : public comm::Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank);
  int rank() const override { return rank_; }
  int world_size() const override;

  std::unique_ptr<comm::Work> all_reduce(torch::Tensor& tensor, comm::ReduceOp op) override;
  std::unique_ptr<comm::Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                             comm::ReduceOp op) override;
  std::unique_ptr<comm::Work> all_gather(torch::Tensor& output,
                                         const torch::Tensor& input) override;
  std::unique_ptr<comm::Work> broadcast(torch::Tensor& tensor, int root) override;
  void barrier() override;
  std::unique_ptr<comm::Work> all_to_all(torch::Tensor& output,
                                         const torch::Tensor& input) override;
  std::unique_ptr<comm::Work> all_to_all_v(torch::Tensor& output, const torch::Tensor& input,
                                           std::vector<int64_t> output_splits,
                                           std::vector<int64_t> input_splits) override;
  std::unique_ptr<comm::Work> exchange(std::vector<comm::PeerTransfer> transfers) override;
  std::unique_ptr<comm::Communicator> split(int color) override;

 private:
  // `splits`: all_to_all_v's input splits (its inputs may differ in size between the ranks).
  std::unique_ptr<comm::Work> issue(comm::CollectiveKind kind, torch::Tensor output,
                                    torch::Tensor input, comm::ReduceOp op, int root,
                                    std::vector<int64_t> splits = {});
  std::shared_ptr<ThreadGroup> group_;
  int rank_;
  uint64_t next_seq_ = 0;
  uint64_t next_split_ = 0;
};

// Forwards to a communicator owned elsewhere: a Trainer owns its communicator, while run_ranks
// owns the thread's.
class BorrowedCommunicator : public comm::Communicator {
 public:
  explicit BorrowedCommunicator(comm::Communicator& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int world_size() const override { return c_.world_size(); }
  std::unique_ptr<comm::Work> all_reduce(torch::Tensor& t, comm::ReduceOp op) override {
    return c_.all_reduce(t, op);
  }
  std::unique_ptr<comm::Work> reduce_scatter(torch::Tensor& out, const torch::Tensor& in,
                                             comm::ReduceOp op) override {
    return c_.reduce_scatter(out, in, op);
  }
  std::unique_ptr<comm::Work> all_gather(torch::Tensor& out, const torch::Tensor& in) override {
    return c_.all_gather(out, in);
  }
  std::unique_ptr<comm::Work> broadcast(torch::Tensor& t, int root) override {
    return c_.broadcast(t, root);
  }
  void barrier() override { c_.barrier(); }
  std::unique_ptr<comm::Work> all_to_all(torch::Tensor& out, const torch::Tensor& in) override {
    return c_.all_to_all(out, in);
  }
  std::unique_ptr<comm::Work> all_to_all_v(torch::Tensor& out, const torch::Tensor& in,
                                           std::vector<int64_t> out_splits,
                                           std::vector<int64_t> in_splits) override {
    return c_.all_to_all_v(out, in, std::move(out_splits), std::move(in_splits));
  }
  std::unique_ptr<comm::Work> exchange(std::vector<comm::PeerTransfer> transfers) override {
    return c_.exchange(std::move(transfers));
  }
  std::unique_ptr<comm::Communicator> split(int color) override { return c_.split(color); }

 private:
  comm::Communicator& c_;
};

// Runs `body(comm)` on world_size threads, one ThreadCommunicator each; rethrows the first
// exception after all threads have ended (a rank that throws leaves its peers blocked only if they
// wait on it, so tests keep ranks in lockstep).
void run_ranks(int world_size, const std::function<void(ThreadCommunicator&)>& body,
               PointToPoint transfers = PointToPoint::kBuffered);

}  // namespace dstrain::testing
