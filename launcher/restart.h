#pragma once
// `--max-restarts N`: the job brought back by the launcher itself after a failure, from the newest
// committed checkpoint, instead of waiting for a person to type `dstrain resume`.
//
// Contract of run_with_restarts:
//  - attempt(k, resume_from) runs the whole job once (plan, spawn, supervise, summary) and says how
//    it ended. resume_from is "" for the first attempt (the command as given), and for a restart
//    <checkpoint_dir>/latest when a checkpoint has been committed, else "" (from the start again).
//  - Success, or an interruption (SIGINT/SIGTERM/SIGHUP to the launcher; SIGUSR1 makes the ranks
//    save and exit 0): no restart, the attempt's exit code is returned.
//  - A deterministic failure is not restarted: a rank that exited with code 2 (bad config, data,
//    tokenizer, checkpoint or flag: exit_code() in core/error.h) before the attempt logged a step
//    or committed a checkpoint ends the job at once ("not restarting: ..."), since the next attempt
//    would read the same input. The step is the last one in the run's metrics file, which always
//    has step 1, so on a fresh run this is exactly "before step 1" (after a resume: before the
//    next logged step). With --exec (no run directory) every failure follows the rule below.
//  - Any other failure (a rank exited non-zero or by a signal, a collective timed out, a frozen
//    rank was killed, a node was lost) is
//    recorded in <out_dir>/restarts.json (metrics/restarts.h). It is charged against
//    max_restarts unless the attempt committed a new checkpoint (then the run made progress and
//    this is no crash loop). While charged failures <= max_restarts: wait backoff_seconds (a signal
//    during the wait stops the job) and start the next attempt. Past that the job fails with the
//    history of causes on stderr and the last attempt's exit code.
//  - max_restarts 0 is one attempt and nothing recorded: exactly the behaviour without restarts.
// The first attempt of a run that does not resume removes a restarts.json of an older run in the
// same out_dir.

#include <functional>
#include <string>
#include <vector>

namespace dstrain::launcher {

struct RestartOptions {
  int max_restarts = 0;          // --max-restarts
  double backoff_seconds = 1.0;  // --restart-backoff: wait before each restart
};

struct AttemptOutcome {
  enum class Kind { kSuccess, kFailed, kInterrupted };
  Kind kind = Kind::kSuccess;
  int exit_code = 0;
  int rank = -1;      // the root-cause rank of a failure, -1 when no single rank (a lost node)
  std::string host;   // where it ran
  std::string cause;  // "exit code 3", "signal SIGKILL (9)", ...
};

// Where a run keeps what a restart needs: "" for both with --exec (no config: a restart runs the
// command again as it was).
struct RunDirs {
  std::string out_dir;         // logging.out_dir
  std::string metrics_file;    // the run's metrics.jsonl (the step a failure came at)
  std::string checkpoint_dir;  // checkpoint.dir
  bool resumes = false;        // the first attempt resumes a checkpoint (`dstrain resume`)
};

using Attempt = std::function<AttemptOutcome(int attempt, const std::string& resume_from)>;

// The rule above: `outcome` is a failure with exit code 2 and the attempt made no progress.
bool is_input_error_before_first_step(const AttemptOutcome& outcome, bool no_new_checkpoint,
                                      bool no_new_step);

// Error(kUsage) for a negative count or backoff.
void check_restart_options(const RestartOptions& options);

int run_with_restarts(const RestartOptions& options, const RunDirs& dirs, const Attempt& attempt);

// `args` with any `--resume-from X` replaced by `--resume-from checkpoint` (added when absent).
std::vector<std::string> with_resume_from(const std::vector<std::string>& args,
                                          const std::string& checkpoint);

}  // namespace dstrain::launcher
