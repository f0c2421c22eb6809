#include "core/bytes.h"

#include <fmt/format.h>

namespace dstrain {

std::string human_bytes(int64_t bytes, int decimals) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.{}f} {}", v, decimals, units[u]);
}

}  // namespace dstrain
