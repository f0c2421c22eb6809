#include "comm/communicator.h"

#include <fmt/format.h>

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
