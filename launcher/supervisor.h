#pragma once
// Runs a set of ranks as local processes to the end: spawn, stream output, detect the first
// failure, tear everything down, report.
//
// Contract:
//  - All ranks exit 0: outcome kSuccess, exit code 0.
//  - The first rank to exit non-zero or by a signal is the root cause: every rank still running is
//    told which rank failed and how on its teardown pipe (core/teardown_reason.h), then every
//    rank's process group gets SIGTERM, then SIGKILL after the grace period; exit code = that
//    rank's code (128 + signal).
//  - SIGUSR1 to the launcher is forwarded to every rank's process group and the job goes on (ranks
//    are expected to save a checkpoint; see docs/launch.md, "Slurm").
//  - SIGINT/SIGTERM/SIGHUP to the launcher: the same teardown, outcome kInterrupted, exit code
//    128 + signal. A second signal during teardown escalates to SIGKILL at once. When
//    failure_elsewhere (below) names a failed rank, the ranks are told it before their SIGTERM.
//  - A rank that beat (core/liveness.h) and then stays silent for the silence limit is frozen (its
//    whole process stopped): it gets SIGKILL at once (SIGKILL also ends a stopped process), it is
//    the root cause ("stopped responding"), and the others are torn down as above. When a rank
//    fails while another has already been silent for kSuspectSilenceSeconds, the silent one is
//    the root cause: a peer's collective timing out on a frozen rank is the effect, not the cause.
//  - When run_local_job returns, every rank's process group has been sent SIGKILL (so nothing a
//    rank started survives it) and every rank is reaped; a GroupGuard covers the launcher dying
//    abruptly.
// Output is routed through RankOutput (prefixed console lines, optional log files, tails).

#include <sys/types.h>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/teardown_reason.h"
#include "launcher/exit_status.h"
#include "launcher/output.h"
#include "launcher/plan.h"

namespace dstrain::launcher {

// Silence that makes a rank suspect when another rank fails: ten missed heartbeats.
constexpr double kSuspectSilenceSeconds = 5.0;

// The silence limit: DSTRAIN_COMM_TIMEOUT seconds (what a rank waits for a peer in a collective),
// 300 when unset. Error(kUsage) for a value that is not a positive number.
double silence_limit_from_env();

struct SupervisorOptions {
  double grace_seconds = 5.0;  // SIGTERM → SIGKILL delay during teardown
  // A rank silent this long after its first heartbeat is frozen (above); <= 0: not watched.
  double silence_limit_seconds = 300.0;
  std::string log_dir;     // "" = no per-rank files; else <log_dir>/rank_<K>.log (must exist)
  OutputTargets targets;   // where prefixed rank output goes
  size_t tail_lines = 10;  // lines of each rank kept for the summary
  // Called at least every 100 ms, from the thread that writes the ranks' output, until
  // run_local_job returns: what it writes to targets' descriptors never splits a rank's line (the
  // node agent's keepalive, node_agent.h).
  std::function<void()> on_tick;
  // Asked once, when a signal to this process starts the teardown: the failed rank the signal was
  // sent for (a node agent told by the root launcher, node_agent.h), or nullopt when the job was
  // simply stopped. The caller records the failure before it sends the signal.
  std::function<std::optional<teardown::RankFailure>()> failure_elsewhere;
};

struct RankReport {
  int rank = 0;
  std::string host;
  pid_t pid = -1;
  RankExit exit;
  double end_seconds = 0;            // since the job started
  bool stopped_by_launcher = false;  // still running when the teardown began
  double silent_seconds = 0;         // > 0: killed as frozen after this long without a heartbeat
  std::vector<std::string> tail;     // last output lines (stdout and stderr, in arrival order)
};

struct JobOutcome {
  enum class Cause { kSuccess, kRankFailed, kInterrupted };
  Cause cause = Cause::kSuccess;
  int exit_code = 0;
  int failed_rank = -1;           // kRankFailed: the root-cause rank
  int interrupt_signal = 0;       // kInterrupted: the signal the launcher received
  bool peer_failed = false;       // kInterrupted: failure_elsewhere named a failed rank
  double seconds = 0;             // wall time of the whole job
  std::vector<RankReport> ranks;  // in rank order
};

// Spawns `ranks` (see spawn_local.h) and supervises them as described above. Throws Error(kIo) if a
// rank cannot be started (ranks already started are torn down first) or a log file cannot be
// created.
JobOutcome run_local_job(const std::vector<RankSpec>& ranks, const SupervisorOptions& options);

// How a rank ended, for summaries and restart records: its exit or signal, or that it stopped
// responding and was killed.
std::string describe(const RankReport& report);

// The multi-line report printed after a failed or interrupted job (a one-line note on success),
// naming the root-cause rank, its host, exit code or signal, time, and its last lines of output.
std::string format_summary(const JobOutcome& outcome, const std::string& hostname);

// This machine's host name (for summaries of local ranks).
std::string local_hostname();

}  // namespace dstrain::launcher
