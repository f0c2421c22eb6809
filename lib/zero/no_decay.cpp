#include "zero/no_decay.h"

#include <algorithm>
#include <cctype>

namespace dstrain::zero {

bool takes_no_decay(const std::string& name, int64_t dim) {
  if (dim == 1) return true;
  const std::string bias = ".bias";
  if (name.size() >= bias.size() &&
      name.compare(name.size() - bias.size(), bias.size(), bias) == 0) {
    return true;
  }
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("norm") != std::string::npos;
}

std::vector<Range> merge_ranges(std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> out;
  for (const Range& r : ranges) {
    if (r.begin >= r.end) continue;
    if (!out.empty() && r.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, r.end);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

}  // namespace dstrain::zero
