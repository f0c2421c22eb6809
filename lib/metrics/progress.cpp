#include "metrics/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include <fmt/format.h>

namespace dstrain::metrics {

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

bool stdout_is_terminal() {
  return ::isatty(STDOUT_FILENO) == 1;
}

std::string ProgressSink::format_line(const Record& r, int64_t total_steps) {
  std::string line = total_steps > 0 ? fmt::format("step {}/{}", r.step, total_steps)
                                     : fmt::format("step {}", r.step);
  if (r.has("train/loss")) line += fmt::format(" | loss {:.4f}", r.get("train/loss"));
  if (r.has("eval/loss")) {
    line += fmt::format(" | eval loss {:.4f} ppl {:.2f}", r.get("eval/loss"), r.get("eval/ppl"));
  }
  if (r.has("lr")) line += fmt::format(" | lr {:.3e}", r.get("lr"));
  if (r.has("grad_norm")) line += fmt::format(" | gnorm {:.3f}", r.get("grad_norm"));
  if (r.has("tokens_per_s")) line += fmt::format(" | {:.0f} tok/s", r.get("tokens_per_s"));
  if (r.has("mfu")) line += fmt::format(" | MFU {:.1f}%", 100.0 * r.get("mfu"));
  if (r.has("eta_s")) line += fmt::format(" | ETA {}", format_duration(r.get("eta_s")));
  return line;
}

ProgressSink::ProgressSink(int64_t total_steps, bool interactive)
    : total_steps_(total_steps), interactive_(interactive) {}

ProgressSink::~ProgressSink() {
  if (line_open_) std::fputs("\n", stdout);
}

void ProgressSink::write(const Record& record) {
  const std::string line = format_line(record, total_steps_);
  const bool is_eval = record.has("eval/loss");
  if (interactive_ && !is_eval) {
    // \x1b[K clears what a longer previous line left behind.
    std::fprintf(stdout, "\r%s\x1b[K", line.c_str());
    line_open_ = true;
  } else {
    if (line_open_) std::fputs("\n", stdout);
    std::fprintf(stdout, "%s\n", line.c_str());
    line_open_ = false;
  }
  std::fflush(stdout);
}

}  // namespace dstrain::metrics
