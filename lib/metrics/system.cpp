#include "metrics/system.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace dstrain::metrics {

int64_t current_rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long pages_total = 0;
  long pages_resident = 0;
  const int n = std::fscanf(f, "%ld %ld", &pages_total, &pages_resident);
  std::fclose(f);
  if (n != 2) return 0;
  return static_cast<int64_t>(pages_resident) * ::sysconf(_SC_PAGESIZE);
}

int64_t peak_rss_bytes() {
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

double mfu(double flops_per_token, double tokens_per_second, double peak_flops) {
  if (peak_flops <= 0) return 0.0;
  return flops_per_token * tokens_per_second / peak_flops;
}

double peak_flops_from_env(double fallback) {
  const char* v = std::getenv("DSTRAIN_PEAK_FLOPS");
  if (v == nullptr) return fallback;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  return (end != v && x > 0) ? x : fallback;
}

}  // namespace dstrain::metrics
