#pragma once
// Rank-aware logging. In a rank process `info` and `debug` print on rank 0 only, so a job's console
// shows one copy of each progress message; `warn` and `error` print on every rank, because a
// problem on rank 5 must not be hidden. Processes that are not ranks (the launcher) have rank -1
// and print all. The level comes from DSTRAIN_LOG_LEVEL (debug|info|warn|error) unless set_level()
// is called. Thread-safe: each message is written with one call under a lock.

#include <string_view>

#include <fmt/format.h>

namespace dstrain::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_rank(int rank);
int rank();
void set_level(Level level);
Level level();

// Writes one line (a newline is added) if `level` is enabled and this rank should print it.
void write(Level level, std::string_view message);

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kDebug) write(Level::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kInfo) write(Level::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::kWarn) write(Level::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::kError, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dstrain::log
