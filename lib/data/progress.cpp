#include "data/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

#include "core/log.h"
#include "metrics/progress.h"

namespace dstrain::data {
namespace {

constexpr double kQuietSeconds = 0.5;    // a shorter pass shows nothing
constexpr double kTerminalPeriod = 0.1;  // redraws on a terminal
constexpr double kLogPeriod = 30.0;      // log lines otherwise
constexpr int kBarWidth = 20;

std::string format_bytes(double bytes) {
  if (bytes < 1e3) return fmt::format("{:.0f} B", bytes);
  if (bytes < 1e6) return fmt::format("{:.1f} kB", bytes / 1e3);
  if (bytes < 1e9) return fmt::format("{:.1f} MB", bytes / 1e6);
  return fmt::format("{:.2f} GB", bytes / 1e9);
}

}  // namespace

Progress::Progress(std::string label, int64_t total_bytes)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total_bytes, 1)),
      terminal_(::isatty(STDERR_FILENO) == 1) {}

Progress::~Progress() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shown_) show(true);
}

void Progress::advance(int64_t bytes) {
  done_ += bytes;
  const double t = clock_.seconds();
  const double period = terminal_ ? kTerminalPeriod : kLogPeriod;
  if (t < kQuietSeconds || t - last_shown_ < period) return;
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);  // a busy display is skipped
  if (!lock.owns_lock() || t - last_shown_ < period) return;
  last_shown_ = t;
  show(false);
}

void Progress::show(bool final) {
  const std::string line =
      format_line(label_, std::min(done_.load(), total_), total_, clock_.seconds());
  if (terminal_) {
    // \x1b[K clears what a longer previous line left behind.
    std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), final ? "\n" : "");
    std::fflush(stderr);
  } else {
    log::info("data: {}", line);
  }
  shown_ = true;
}

std::string Progress::format_line(const std::string& label, int64_t done, int64_t total,
                                  double seconds) {
  const double fraction = total > 0 ? std::clamp(double(done) / double(total), 0.0, 1.0) : 1.0;
  const int filled = static_cast<int>(fraction * kBarWidth);
  const double rate = seconds > 0 ? double(done) / seconds : 0.0;
  std::string line =
      fmt::format("tokenizing {} [{}{}] {:3.0f}% {}/{}", label, std::string(filled, '#'),
                  std::string(kBarWidth - filled, '.'), 100.0 * fraction,
                  format_bytes(double(done)), format_bytes(double(total)));
  if (rate > 0) {
    line += fmt::format(" {}/s", format_bytes(rate));
    if (done < total) {
      line += fmt::format(" {} left", metrics::format_duration(double(total - done) / rate));
    }
  }
  return line;
}

}  // namespace dstrain::data
