#include "hub/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace dstrain::hub {
namespace {

constexpr int64_t kStartLineBytes = 10'000'000;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

bool stderr_is_terminal() {
  return ::isatty(STDERR_FILENO) == 1;
}

std::string human_bytes(double bytes) {
  static const char* kUnits[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, ++u;
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, kUnits[u]);
}

DownloadProgress::DownloadProgress(std::string name, int64_t total, int64_t done, bool terminal)
    : name_(std::move(name)),
      total_(total),
      done_(done),
      start_done_(done),
      terminal_(terminal),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  std::string size = total_ >= 0 ? " (" + human_bytes(static_cast<double>(total_)) + ")" : "";
  std::string resumed =
      done_ > 0 ? ", resuming at " + human_bytes(static_cast<double>(done_)) : std::string();
  // Plain output: small files get only their final line; large ones and resumed ones a start line.
  if (terminal_)
    draw(false);
  else if (total_ < 0 || total_ >= kStartLineBytes || done_ > 0)
    line(fmt::format("downloading {}{}{}", name_, size, resumed));
}

void DownloadProgress::advance(int64_t bytes) {
  done_ += bytes;
  const double since = seconds_since(last_draw_);
  if ((terminal_ && since >= 0.1) || (!terminal_ && since >= 30)) {
    last_draw_ = std::chrono::steady_clock::now();
    draw(false);
  }
}

void DownloadProgress::restart() {
  done_ = start_done_ = 0;
  start_ = std::chrono::steady_clock::now();
}

void DownloadProgress::finish() {
  draw(true);
}

void DownloadProgress::draw(bool final) {
  const double elapsed = std::max(1e-3, seconds_since(start_));
  const double rate = static_cast<double>(done_ - start_done_) / elapsed;
  const double frac = total_ > 0 ? std::min(1.0, static_cast<double>(done_) / total_) : 0.0;
  const std::string amount =
      total_ >= 0 ? human_bytes(done_) + "/" + human_bytes(total_) : human_bytes(done_);
  if (!terminal_) {
    if (final)
      line(fmt::format("downloaded {}: {} in {:.1f} s ({}/s)", name_, human_bytes(done_), elapsed,
                       human_bytes(rate)));
    else
      line(fmt::format("{}: {:.0f}% ({}, {}/s)", name_, 100 * frac, amount, human_bytes(rate)));
    return;
  }
  const int width = 24;
  const int filled = static_cast<int>(frac * width);
  std::string shown = name_.size() > 32 ? "…" + name_.substr(name_.size() - 31) : name_;
  std::fprintf(stderr, "\r%-32s %3.0f%% [%s%s] %s %s/s\033[K%s", shown.c_str(), 100 * frac,
               std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
               amount.c_str(), human_bytes(rate).c_str(), final ? "\n" : "");
  std::fflush(stderr);
}

void DownloadProgress::line(const std::string& text) const {
  std::fprintf(stdout, "%s\n", text.c_str());
  std::fflush(stdout);
}

}  // namespace dstrain::hub
