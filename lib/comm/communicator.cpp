#include "comm/communicator.h"

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

uint64_t CommStats::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [kind, bytes] : bytes_sent) total += bytes;
  return total;
}

}  // namespace dstrain::comm
