// A rank for the supervisor tests that beats like a dstrain rank (core/liveness.h):
//   liveness_beater PID_FILE SECONDS EXIT_CODE
// It starts its heartbeat, writes its pid to PID_FILE (whole, by rename), lives SECONDS and
// exits with EXIT_CODE.

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/liveness.h"

int main(int argc, char** argv) {
  if (argc != 4) return 64;
  const auto beat = dstrain::liveness::start_beat_from_env();
  const std::string path = argv[1];
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return 65;
  std::fprintf(f, "%d\n", static_cast<int>(::getpid()));
  std::fclose(f);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return 66;
  ::usleep(static_cast<useconds_t>(std::atof(argv[2]) * 1e6));
  return std::atoi(argv[3]);
}
