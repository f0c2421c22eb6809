#pragma once
// Slurm hostlist expressions, as in SLURM_JOB_NODELIST: comma-separated names, each with optional
// bracketed ranges: "node[01-04,07],gpu-a[1-2]" → node01 node02 node03 node04 node07 gpu-a1 gpu-a2.
// Zero padding is kept (the width of a range's lower bound), several bracket groups in one name
// expand as a product ("r[1-2]n[1-2]" → r1n1 r1n2 r2n1 r2n2), order is preserved.
// Malformed input (unbalanced brackets, empty or reversed ranges, non-digits) is Error(kInput).

#include <string>
#include <vector>

namespace dstrain::launcher {

std::vector<std::string> expand_hostlist(const std::string& expression);

}  // namespace dstrain::launcher
