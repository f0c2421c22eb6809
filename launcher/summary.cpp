// format_summary (declared in supervisor.h): what the user reads after a job ends. The root cause
// comes first with its last output, then one line per rank, so "which rank, where, why" is answered
// without scrolling through interleaved logs.

#include <fmt/format.h>

#include "launcher/supervisor.h"

namespace dstrain::launcher {
namespace {

std::string host_label(const std::string& host, const std::string& hostname) {
  if (host == "localhost" && !hostname.empty() && hostname != "localhost") {
    return fmt::format("localhost ({})", hostname);
  }
  return host;
}

std::string rank_state(const RankReport& r, const JobOutcome& outcome) {
  std::string state = describe(r);
  if (outcome.cause == JobOutcome::Cause::kRankFailed && r.rank == outcome.failed_rank) {
    state += "  <- root cause";
  } else if (r.stopped_by_launcher) {
    state += "  (stopped by the launcher)";
  }
  return state;
}

void append_rank_table(std::string& out, const JobOutcome& outcome, const std::string& hostname) {
  out += "  ranks:\n";
  for (const RankReport& r : outcome.ranks) {
    out += fmt::format("    rank {:<4} {}  pid {:<8} after {:.1f} s  {}\n", r.rank,
                       host_label(r.host, hostname), r.pid, r.end_seconds, rank_state(r, outcome));
  }
}

void append_root_cause(std::string& out, const RankReport& r, const std::string& hostname) {
  out += fmt::format("dstrain launch: rank {} failed on host {}: {} after {:.1f} s (pid {})\n",
                     r.rank, host_label(r.host, hostname), describe(r), r.end_seconds, r.pid);
  if (r.tail.empty()) {
    out += fmt::format("  rank {} printed nothing\n", r.rank);
    return;
  }
  out += fmt::format("  last {} line(s) of rank {}:\n", r.tail.size(), r.rank);
  for (const std::string& line : r.tail) out += "    | " + line + "\n";
}

}  // namespace

std::string format_summary(const JobOutcome& outcome, const std::string& hostname) {
  std::string out;
  switch (outcome.cause) {
    case JobOutcome::Cause::kSuccess:
      return fmt::format("dstrain launch: all {} rank(s) exited 0 after {:.1f} s\n",
                         outcome.ranks.size(), outcome.seconds);
    case JobOutcome::Cause::kInterrupted:
      out = outcome.peer_failed
                ? fmt::format(
                      "dstrain launch: stopped after {:.1f} s because a rank on another "
                      "node failed; all ranks were stopped\n",
                      outcome.seconds)
                : fmt::format(
                      "dstrain launch: interrupted by {} after {:.1f} s; all ranks were stopped\n",
                      signal_name(outcome.interrupt_signal), outcome.seconds);
      break;
    case JobOutcome::Cause::kRankFailed:
      for (const RankReport& r : outcome.ranks) {
        if (r.rank == outcome.failed_rank) append_root_cause(out, r, hostname);
      }
      break;
  }
  append_rank_table(out, outcome, hostname);
  out += fmt::format("dstrain launch: exit code {}\n", outcome.exit_code);
  return out;
}

}  // namespace dstrain::launcher
