#include "model/weight_decay.h"

#include <algorithm>
#include <cctype>

namespace dstrain::model {

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

}  // namespace dstrain::model
