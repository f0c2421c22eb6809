#pragma once
// A watchdog for process groups, covering the one case the supervisor cannot: the launcher itself
// dying abruptly (SIGKILL, the OOM killer). PR_SET_PDEATHSIG then kills each rank, but not
// processes a rank started (data workers, a shell's children); those would be orphaned.
//
// The guard is a small forked process in its own process group (so a Ctrl-C or a group kill aimed
// at the launcher does not take it down first). It reads process group ids from a pipe whose only
// write end the launcher holds. End of file on that pipe means the launcher is gone without
// disarming the guard, and the guard sends SIGKILL to every group it was told about, then exits.
// The launcher disarms the guard only after its own teardown, before reaping the rank leaders:
// until a leader is reaped its pid, and so its group id, cannot be reused, so the guard never
// signals a stranger.

#include <sys/types.h>

namespace dstrain::launcher {

class GroupGuard {
 public:
  GroupGuard();   // forks the guard; Error(kIo) on failure
  ~GroupGuard();  // disarms (if not yet) and reaps the guard
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;

  void watch(pid_t pgid);  // the guard will kill this group if the launcher dies
  void disarm();           // the launcher cleaned up itself; the guard exits without killing
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int write_fd_ = -1;
};

}  // namespace dstrain::launcher
