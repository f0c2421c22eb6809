#include "optim/shard_segments.h"

#include <algorithm>

#include "core/error.h"

namespace dstrain::optim {

std::vector<Segment> decay_segments(int64_t numel, std::vector<Range> no_decay) {
  for (const Range& r : no_decay) {
    if (r.begin < 0 || r.end < r.begin || r.end > numel) {
      fail(ErrorKind::kInternal, "no_decay range [{}, {}) is not within a shard of {} elements",
           r.begin, r.end, numel);
    }
  }
  std::sort(no_decay.begin(), no_decay.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Segment> segments;
  int64_t cursor = 0;
  for (const Range& r : no_decay) {
    if (r.begin > cursor) segments.push_back({cursor, r.begin, true});
    int64_t begin = std::max(cursor, r.begin);
    if (r.end > begin) {
      if (!segments.empty() && !segments.back().decay && segments.back().end == begin) {
        segments.back().end = r.end;
      } else {
        segments.push_back({begin, r.end, false});
      }
      cursor = r.end;
    }
  }
  if (cursor < numel) segments.push_back({cursor, numel, true});
  return segments;
}

}  // namespace dstrain::optim
