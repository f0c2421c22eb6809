#pragma once
// How one rank lives and ends, owned by one object for the whole process (docs/architecture.md,
// "How a failure ends the job"):
//   - liveness: from the start, the heartbeat to the launcher that spawned the rank, which names
//     and kills a rank that goes silent (core/liveness.h);
//   - the stop request: SIGUSR1 (Slurm's pre-preemption signal, forwarded by the launcher) asks
//     for a checkpoint within two steps and a clean stop (stop_requested(); the ranks' stop vote,
//     step_sync.h);
//   - termination: on SIGTERM or SIGINT every rank reads the reason the launcher wrote on its
//     teardown pipe (core/teardown_reason.h), says on stderr why it stops ("Terminated (the
//     launcher stops the job: rank 3 on node1 failed: exit code 1): stopping", or "... (the job
//     was stopped) ..."), runs what the run asked to be run then (on_end(): rank 0 ends its tracked
//     runs FAILED or KILLED) within end_seconds(), and dies by the signal (metrics/termination.h),
//     the exit status the launcher expects.
// A rank started without `dstrain launch` has neither socket nor pipe: it does not beat and every
// signal reads as "the job was stopped".

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/liveness.h"
#include "core/teardown_reason.h"
#include "metrics/termination.h"

namespace dstrain::train {

class RankLifetime {
 public:
  // What to run when the rank is stopped by a signal: `failure` as read from the teardown pipe,
  // within `seconds`.
  using OnEnd = std::function<void(int signo, const std::optional<teardown::RankFailure>& failure,
                                   double seconds)>;

  // Starts the heartbeat (DSTRAIN_LIVENESS_FD), installs the SIGUSR1 stop request and the
  // termination watch. Error(kUsage) for a malformed DSTRAIN_LIVENESS_FD, DSTRAIN_TEARDOWN_FD or
  // DSTRAIN_GRACE_SECONDS. One per process.
  RankLifetime();
  ~RankLifetime();
  RankLifetime(const RankLifetime&) = delete;
  RankLifetime& operator=(const RankLifetime&) = delete;

  // Set by SIGUSR1: save a checkpoint within two steps (the ranks vote) and stop.
  static std::atomic<bool>& stop_requested();

  // The seconds the end of a run may take after a signal: what the launcher's grace before its
  // SIGKILL (DSTRAIN_GRACE_SECONDS) leaves once 2.5 s are kept for the rest of the exit, at least
  // half of it, at most 30 s; 2.5 s without a launcher.
  double end_seconds() const { return end_seconds_; }

  // Runs `fn` (on the watcher thread, after the line on stderr) when a signal stops the rank, until
  // the returned handle is destroyed; handles run in the order they were made.
  class EndHandle {
   public:
    EndHandle() = default;
    EndHandle(EndHandle&& other) noexcept;
    EndHandle& operator=(EndHandle&& other) noexcept;
    ~EndHandle();

   private:
    friend class RankLifetime;
    EndHandle(RankLifetime* owner, size_t slot) : owner_(owner), slot_(slot) {}
    void release() noexcept;
    RankLifetime* owner_ = nullptr;
    size_t slot_ = 0;
  };
  [[nodiscard]] EndHandle on_end(OnEnd fn);

 private:
  void ended(int signo, const std::optional<teardown::RankFailure>& failure);

  std::unique_ptr<liveness::Beat> beat_;
  double end_seconds_ = 0;
  std::mutex mutex_;                                  // guards on_end_
  std::vector<OnEnd> on_end_;                         // an empty slot: its handle is gone
  std::unique_ptr<metrics::TerminationWatch> watch_;  // last: stopped first
};

}  // namespace dstrain::train
