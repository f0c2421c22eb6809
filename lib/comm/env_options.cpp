// rendezvous_options_from_env(): the variables torchrun and `dstrain launch` give every rank.
// RANK and WORLD_SIZE come together or not at all (absent: a single-process world); MASTER_ADDR and
// MASTER_PORT default to 127.0.0.1:29500. Every present variable must parse completely.

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "comm/communicator.h"
#include "core/error.h"

namespace dstrain::comm {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

long parse_int(const char* name, const char* text, long min, long max) {
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || value < min || value > max) {
    fail(ErrorKind::kUsage, "environment variable {}='{}' is not an integer in [{}, {}]", name,
         text, min, max);
  }
  return value;
}

double parse_seconds(const char* name, const char* text) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(value) || value <= 0) {
    fail(ErrorKind::kUsage, "environment variable {}='{}' is not a positive number of seconds",
         name, text);
  }
  return value;
}

}  // namespace

RendezvousOptions rendezvous_options_from_env() {
  RendezvousOptions options;
  const char* rank = env("RANK");
  const char* world = env("WORLD_SIZE");
  if ((rank == nullptr) != (world == nullptr)) {
    fail(ErrorKind::kUsage, "environment variable {} is set but {} is not; set both or neither",
         rank ? "RANK" : "WORLD_SIZE", rank ? "WORLD_SIZE" : "RANK");
  }
  if (world != nullptr) {
    options.world_size = static_cast<int>(parse_int("WORLD_SIZE", world, 1, 1 << 20));
    options.rank = static_cast<int>(parse_int("RANK", rank, 0, 1 << 20));
    if (options.rank >= options.world_size) {
      fail(ErrorKind::kUsage, "environment variable RANK={} must be below WORLD_SIZE={}",
           options.rank, options.world_size);
    }
  }
  if (const char* addr = env("MASTER_ADDR")) options.master_addr = addr;
  if (const char* port = env("MASTER_PORT")) {
    options.master_port = static_cast<int>(parse_int("MASTER_PORT", port, 1, 65535));
  }
  if (const char* timeout = env("DSTRAIN_COMM_TIMEOUT")) {
    double seconds = parse_seconds("DSTRAIN_COMM_TIMEOUT", timeout);
    options.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
  }
  return options;
}

}  // namespace dstrain::comm
