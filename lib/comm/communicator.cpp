#include "comm/communicator.h"

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

uint64_t CommStats::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [kind, bytes] : bytes_sent) total += bytes;
  return total;
}

}  // namespace dstrain::comm
