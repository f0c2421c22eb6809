#pragma once
// A rank's liveness, as its local launcher sees it: independent of every other rank.
//
// The launcher (or node agent) that spawns a rank gives it one end of a datagram socket pair as
// file descriptor kLivenessFd and names it in DSTRAIN_LIVENESS_FD. The rank runs a thread that
// sends one datagram there every kLivenessBeat. That thread does no work of the rank, so a rank
// that is busy, slow, or blocked in a collective on a dead peer keeps beating; a rank whose whole
// process stopped (SIGSTOP, a frozen container or VM, a debugger) goes silent. The launcher names
// and kills a rank that stays silent for the silence limit (launcher/supervisor.h), whichever rank
// it is: the watch does not live in rank 0, so rank 0 freezing is caught like any other.
//
// A process started without the variable (by hand, by srun without `dstrain launch`) does not
// beat; its peers still fail their collectives after DSTRAIN_COMM_TIMEOUT (docs/launch.md).

#include <chrono>
#include <memory>

namespace dstrain::liveness {

inline constexpr int kLivenessFd = 3;
inline constexpr const char* kLivenessFdVar = "DSTRAIN_LIVENESS_FD";
inline constexpr std::chrono::milliseconds kLivenessBeat{500};

// The beating thread; stops (and joins) when destroyed. Never throws after construction: a send
// that fails (the launcher is gone) ends the thread quietly.
class Beat {
 public:
  explicit Beat(int fd);
  ~Beat();
  Beat(const Beat&) = delete;
  Beat& operator=(const Beat&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Starts beating when DSTRAIN_LIVENESS_FD names a descriptor; nullptr when it is unset. A value
// that is not a non-negative integer is Error(kUsage).
std::unique_ptr<Beat> start_beat_from_env();

}  // namespace dstrain::liveness
