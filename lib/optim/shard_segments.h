#pragma once
// Splits a shard [0, numel) into maximal segments that either take weight decay or do not, from
// the (possibly unsorted, overlapping) no_decay ranges. Validated once, when an optimizer is built.

#include <vector>

#include "optim/optimizer.h"

namespace dstrain::optim {

struct Segment {
  int64_t begin = 0;
  int64_t end = 0;
  bool decay = true;
};

// Throws Error(kInternal) for a range outside [0, numel) or with end < begin.
std::vector<Segment> decay_segments(int64_t numel, std::vector<Range> no_decay);

// Calls fn(segment_part) for the parts of `segments` inside [begin, end).
template <typename Fn>
void for_each_segment_in(const std::vector<Segment>& segments, int64_t begin, int64_t end,
                         Fn&& fn) {
  for (const Segment& s : segments) {
    Segment part{std::max(s.begin, begin), std::min(s.end, end), s.decay};
    if (part.begin < part.end) fn(part);
  }
}

}  // namespace dstrain::optim
