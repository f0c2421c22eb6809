#include "launcher/restart.h"

#include <poll.h>
#include <chrono>
#include <cmath>
#include <csignal>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/secrets.h"
#include "core/shared_files.h"
#include "launcher/exit_status.h"
#include "launcher/output.h"
#include "launcher/signals.h"
#include "metrics/restarts.h"

namespace dstrain::launcher {
namespace {

namespace stdfs = std::filesystem;

std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// The tag `latest` names ("" when nothing is committed, or with --exec).
std::string latest_tag(const RunDirs& dirs) {
  if (dirs.checkpoint_dir.empty()) return "";
  return shared_files::read_latest(dirs.checkpoint_dir).value_or("");
}

// Waits `seconds` unless a signal (other than SIGCHLD) arrives first; returns it, or 0.
int wait_unless_signalled(double seconds) {
  SignalPipe signals;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return 0;
    pollfd p{signals.fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    for (const ReceivedSignal& s : signals.drain())
      if (s.number != SIGCHLD) return s.number;
  }
}

long logged_step(const RunDirs& dirs) {
  return dirs.metrics_file.empty() ? -1 : metrics::last_logged_step(dirs.metrics_file);
}

// The metrics file's last step did not move (-1 after: nothing logged, e.g. a fresh run whose
// file was started anew and has no step yet).
bool no_new_step(const RunDirs& dirs, long before) {
  const long after = logged_step(dirs);
  return after < 0 || after == before;
}

std::string who_failed(const AttemptOutcome& o) {
  if (o.rank >= 0) return fmt::format("rank {} on host {}", o.rank, o.host);
  return o.host.empty() ? std::string("a rank") : o.host;
}

std::string describe(const metrics::RestartRecord& r) {
  std::string who = r.rank >= 0 ? fmt::format("rank {} on host {}", r.rank, r.host) : r.host;
  std::string at = r.step >= 0 ? fmt::format(" at step {}", r.step) : " before its first step";
  return fmt::format("attempt {}: {}: {}{} ({}{})", r.attempt, who, r.cause, at, r.time,
                     r.counted ? "" : ", not counted: a checkpoint was committed before it");
}

}  // namespace

bool is_input_error_before_first_step(const AttemptOutcome& outcome, bool no_new_checkpoint,
                                      bool no_new_step) {
  return outcome.kind == AttemptOutcome::Kind::kFailed &&
         outcome.exit_code == exit_code(ErrorKind::kInput) && no_new_checkpoint && no_new_step;
}

void check_restart_options(const RestartOptions& o) {
  if (o.max_restarts < 0)
    fail(ErrorKind::kUsage, "--max-restarts must be >= 0, got {}", o.max_restarts);
  if (!std::isfinite(o.backoff_seconds) || o.backoff_seconds < 0) {
    fail(ErrorKind::kUsage, "--restart-backoff must be a number of seconds >= 0, got {}",
         o.backoff_seconds);
  }
}

int run_with_restarts(const RestartOptions& options, const RunDirs& dirs, const Attempt& attempt) {
  if (options.max_restarts == 0) return attempt(0, "").exit_code;
  std::vector<metrics::RestartRecord> history;
  if (!dirs.out_dir.empty()) {
    if (dirs.resumes)
      history = metrics::read_restarts(metrics::restarts_file(dirs.out_dir));
    else
      metrics::write_restarts(dirs.out_dir, {});
  }
  int charged = 0;
  std::string resume_from;
  for (int k = 0;; ++k) {
    const std::string before = latest_tag(dirs);
    const long step_before = logged_step(dirs);
    const AttemptOutcome outcome = attempt(k, resume_from);
    if (outcome.kind != AttemptOutcome::Kind::kFailed) return outcome.exit_code;

    const std::string after = latest_tag(dirs);
    if (!dirs.metrics_file.empty() &&
        is_input_error_before_first_step(outcome, after == before,
                                         no_new_step(dirs, step_before))) {
      write_all(2, secrets::redact(fmt::format(
                       "dstrain launch: not restarting: {} failed with an input error ({}) before "
                       "its first step; it would fail the same way again (see its output above)\n",
                       who_failed(outcome), outcome.cause)));
      return outcome.exit_code;
    }
    metrics::RestartRecord r;
    r.attempt = k;
    r.time = utc_now();
    r.rank = outcome.rank;
    r.host = outcome.host;
    r.cause = secrets::redact(outcome.cause);
    r.exit_code = outcome.exit_code;
    r.step = logged_step(dirs);
    r.resumed_from = after;
    r.counted = after.empty() || after == before;
    charged += r.counted ? 1 : 0;
    history.push_back(r);
    if (charged > options.max_restarts) {
      std::string out = fmt::format(
          "dstrain launch: giving up: {} failure(s) without a new checkpoint, more than "
          "--max-restarts {}; the failures:\n",
          charged, options.max_restarts);
      for (const auto& h : history) out += "  " + describe(h) + "\n";
      write_all(2, secrets::redact(out));
      if (!dirs.out_dir.empty()) metrics::write_restarts(dirs.out_dir, history);
      return outcome.exit_code;
    }
    if (!dirs.out_dir.empty()) metrics::write_restarts(dirs.out_dir, history);
    resume_from = after.empty() ? "" : (stdfs::path(dirs.checkpoint_dir) / "latest").string();
    write_all(2, fmt::format("dstrain launch: restart {} ({} of at most {} counted) in {:g} s, {}: "
                             "{}\n",
                             history.size(), charged, options.max_restarts, options.backoff_seconds,
                             after.empty() ? "from the start (no checkpoint committed yet)"
                                           : "from checkpoint " + after,
                             describe(r)));
    if (int sig = wait_unless_signalled(options.backoff_seconds)) {
      write_all(2, fmt::format("dstrain launch: {} during the wait before the restart; stopped\n",
                               signal_name(sig)));
      return 128 + sig;
    }
  }
}

std::vector<std::string> with_resume_from(const std::vector<std::string>& args,
                                          const std::string& checkpoint) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--resume-from" && i + 1 < args.size()) {
      ++i;
      continue;
    }
    if (args[i].rfind("--resume-from=", 0) == 0) continue;
    out.push_back(args[i]);
  }
  out.push_back("--resume-from");
  out.push_back(checkpoint);
  return out;
}

}  // namespace dstrain::launcher
