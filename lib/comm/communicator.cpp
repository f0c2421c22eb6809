#include "comm/communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace dstrain::comm {

const char* to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
    case CollectiveKind::kSend:
      return "send";
    case CollectiveKind::kRecv:
      return "recv";
  }
  return "unknown";
}

void check_all_to_all_shapes(const torch::Tensor& output, const torch::Tensor& input,
                             int world_size) {
  if (input.scalar_type() != output.scalar_type() || input.numel() != output.numel() ||
      input.numel() % world_size != 0) {
    fail(ErrorKind::kInternal,
         "all_to_all: expected input and output of one dtype and size divisible by {}, got {} {} "
         "and {} {}",
         world_size, input.numel(), c10::toString(input.scalar_type()), output.numel(),
         c10::toString(output.scalar_type()));
  }
}

void check_all_to_all_v_shapes(const torch::Tensor& output, const torch::Tensor& input,
                               const std::vector<int64_t>& output_splits,
                               const std::vector<int64_t>& input_splits, int world_size) {
  const auto rows = [](const std::vector<int64_t>& splits) {
    int64_t sum = 0;
    for (int64_t s : splits) sum += s < 0 ? -(int64_t{1} << 62) : s;
    return sum;
  };
  const bool ok = input.dim() >= 1 && output.dim() == input.dim() &&
                  input.scalar_type() == output.scalar_type() && input.is_contiguous() &&
                  output.is_contiguous() && input.sizes().slice(1) == output.sizes().slice(1) &&
                  static_cast<int>(input_splits.size()) == world_size &&
                  static_cast<int>(output_splits.size()) == world_size &&
                  rows(input_splits) == input.size(0) && rows(output_splits) == output.size(0);
  if (!ok) {
    fail(ErrorKind::kInternal,
         "all_to_all_v: expected contiguous input and output of one dtype and row shape whose rows "
         "are the splits' sums over {} ranks, got input {} {} split {} and output {} {} split {}",
         world_size, fmt::join(input.sizes(), "x"), c10::toString(input.scalar_type()),
         fmt::join(input_splits, ","), fmt::join(output.sizes(), "x"),
         c10::toString(output.scalar_type()), fmt::join(output_splits, ","));
  }
}

uint64_t all_to_all_v_bytes(const torch::Tensor& input, const std::vector<int64_t>& input_splits,
                            int rank) {
  const int64_t row = input.size(0) > 0 ? input.numel() / input.size(0) : 0;
  int64_t rows = 0;
  for (size_t j = 0; j < input_splits.size(); ++j) {
    if (static_cast<int>(j) != rank) rows += input_splits[j];
  }
  return static_cast<uint64_t>(rows * row) * input.element_size();
}

void check_peer_transfers(const std::vector<PeerTransfer>& transfers, int rank, int world_size) {
  if (transfers.empty()) fail(ErrorKind::kInternal, "exchange: no transfers");
  for (const PeerTransfer& t : transfers) {
    if (t.kind != CollectiveKind::kSend && t.kind != CollectiveKind::kRecv) {
      fail(ErrorKind::kInternal, "exchange: a transfer's kind is {}; expected send or recv",
           to_string(t.kind));
    }
    if (t.peer < 0 || t.peer >= world_size || t.peer == rank) {
      fail(ErrorKind::kInternal, "{}: peer {} is not another rank of a world of {} (this is {})",
           to_string(t.kind), t.peer, world_size, rank);
    }
    if (!t.tensor.defined() || !t.tensor.is_contiguous()) {
      fail(ErrorKind::kInternal, "{} with rank {}: the tensor must be defined and contiguous",
           to_string(t.kind), t.peer);
    }
  }
}

std::string describe_transfers(const std::vector<PeerTransfer>& transfers,
                               const std::function<int(int)>& world_rank) {
  std::string out;
  for (size_t i = 0; i < transfers.size(); ++i) {
    const PeerTransfer& t = transfers[i];
    out += fmt::format(
        "{}{} {} rank {}", i == 0 ? "" : (i + 1 == transfers.size() ? " and " : ", "),
        to_string(t.kind), t.kind == CollectiveKind::kSend ? "to" : "from", world_rank(t.peer));
  }
  return out;
}

void check_split_color(int color) {
  if (color < 0 && color != kNoGroup) {
    fail(ErrorKind::kInternal, "split: color {} is neither >= 0 nor kNoGroup", color);
  }
}

std::unique_ptr<Work> Communicator::send(const torch::Tensor& tensor, int peer) {
  return exchange({{CollectiveKind::kSend, tensor, peer}});
}

std::unique_ptr<Work> Communicator::recv(torch::Tensor& tensor, int peer) {
  return exchange({{CollectiveKind::kRecv, tensor, peer}});
}

uint64_t CommStats::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [kind, bytes] : bytes_sent) total += bytes;
  return total;
}

}  // namespace dstrain::comm
