#include "comm/solo_communicator.h"

#include "core/error.h"

namespace dstrain::comm {
namespace {

class Done final : public Work {
 public:
  void wait() override {}
};

// `output` takes `input` (same elements), or stays as it is when it is the same memory.
std::unique_ptr<Work> copy(torch::Tensor& output, const torch::Tensor& input) {
  if (output.numel() != input.numel()) {
    fail(ErrorKind::kInternal, "one-rank collective: {} elements in, {} out", input.numel(),
         output.numel());
  }
  if (!output.is_same(input)) output.view(-1).copy_(input.reshape(-1));
  return std::make_unique<Done>();
}

class SoloCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp) override {
    count(CollectiveKind::kAllReduce, 0);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                       ReduceOp) override {
    count(CollectiveKind::kReduceScatter, 0);
    return copy(output, input);
  }
  std::unique_ptr<Work> all_gather(torch::Tensor& output, const torch::Tensor& input) override {
    count(CollectiveKind::kAllGather, 0);
    return copy(output, input);
  }
  std::unique_ptr<Work> broadcast(torch::Tensor&, int root) override {
    if (root != 0) fail(ErrorKind::kInternal, "one-rank broadcast from rank {}", root);
    count(CollectiveKind::kBroadcast, 0);
    return std::make_unique<Done>();
  }
  void barrier() override { count(CollectiveKind::kBarrier, 0); }
  std::unique_ptr<Work> all_to_all(torch::Tensor& output, const torch::Tensor& input) override {
    count(CollectiveKind::kAllToAll, 0);
    return copy(output, input);
  }
  std::unique_ptr<Work> all_to_all_v(torch::Tensor& output, const torch::Tensor& input,
                                     std::vector<int64_t> output_splits,
                                     std::vector<int64_t> input_splits) override {
    check_all_to_all_v_shapes(output, input, output_splits, input_splits, 1);
    count(CollectiveKind::kAllToAll, 0);
    return copy(output, input);
  }
  // A world of one has no peer: check_peer_transfers refuses every transfer.
  std::unique_ptr<Work> exchange(std::vector<PeerTransfer> transfers) override {
    check_peer_transfers(transfers, 0, 1);
    return std::make_unique<Done>();
  }
  std::unique_ptr<Communicator> split(int color) override {
    check_split_color(color);
    return std::make_unique<SoloCommunicator>();
  }
};

}  // namespace

std::unique_ptr<Communicator> make_solo_communicator() {
  return std::make_unique<SoloCommunicator>();
}

}  // namespace dstrain::comm
