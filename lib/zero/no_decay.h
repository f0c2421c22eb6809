#pragma once
// Which parameters take no weight decay, and where they sit in an optimizer shard.
// Rule (as in common LLM recipes): 1-D parameters (norm weights, biases), names ending in ".bias",
// and names containing "norm" (any case) are not decayed.

#include <string>
#include <vector>

#include "zero/partition.h"

namespace dstrain::zero {

bool takes_no_decay(const std::string& name, int64_t dim);

// Sorts `ranges` and merges overlapping or touching ones; empty ranges are dropped.
std::vector<Range> merge_ranges(std::vector<Range> ranges);

}  // namespace dstrain::zero
