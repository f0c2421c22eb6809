#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/secrets.h"

namespace dstrain::log {
namespace {

std::atomic<int> g_rank{-1};

Level level_from_env() {
  const char* v = std::getenv("DSTRAIN_LOG_LEVEL");
  if (v == nullptr) return Level::kInfo;
  if (std::strcmp(v, "debug") == 0) return Level::kDebug;
  if (std::strcmp(v, "warn") == 0) return Level::kWarn;
  if (std::strcmp(v, "error") == 0) return Level::kError;
  return Level::kInfo;
}

std::atomic<Level>& level_ref() {
  static std::atomic<Level> lvl{level_from_env()};
  return lvl;
}

std::mutex g_mutex;

}  // namespace

void set_rank(int rank) {
  g_rank.store(rank);
}
int rank() {
  return g_rank.load();
}
void set_level(Level level) {
  level_ref().store(level);
}
Level level() {
  return level_ref().load();
}

void write(Level lvl, std::string_view message) {
  if (lvl < level()) return;
  const int r = rank();
  if (lvl <= Level::kInfo && r > 0) return;
  FILE* out = lvl >= Level::kWarn ? stderr : stdout;
  const char* tag = lvl == Level::kWarn ? "warning: " : lvl == Level::kError ? "error: " : "";
  const std::string text = secrets::redact(message);  // secret values never reach the console
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(out, "%s%.*s\n", tag, static_cast<int>(text.size()), text.data());
  std::fflush(out);
}

}  // namespace dstrain::log
