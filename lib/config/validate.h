#pragma once
// Rules that involve more than one setting, checked after every source is merged: the DeepSpeed
// batch-size triple, required keys, and combinations that cannot work together.

#include <string>

#include "config/config.h"
#include "config/merge.h"

namespace dstrain::config::detail {

// Fills in a derivable batch-size term, then checks the cross-field rules. `file` names the
// config in messages about settings that were never written. Throws Error(kConfig).
void resolve_and_validate(Config& config, const Merger& merger, const std::string& file,
                          int world_size);

}  // namespace dstrain::config::detail
