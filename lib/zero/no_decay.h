#pragma once
// Where the parameters that take no weight decay (model/weight_decay.h) sit in an optimizer shard.

#include <vector>

#include "zero/partition.h"

namespace dstrain::zero {

// Sorts `ranges` and merges overlapping or touching ones; empty ranges are dropped.
std::vector<Range> merge_ranges(std::vector<Range> ranges);

}  // namespace dstrain::zero
