#pragma once
// One srun step of node agents supervised by the launcher, and the checks made on the allocation's
// nodes between steps: what `dstrain launch --max-restarts` needs under Slurm, where the launcher
// must outlive a failed step to start the next one. (Without restarts it execs srun, slurm.h.)
//
// Contract of run_srun_step:
//  - srun runs as a child in its own process group (a terminal's Ctrl-C reaches only the launcher)
//    and gets SIGKILL if the launcher dies (spawn_local.h); the end of the batch script then ends
//    the step.
//  - srun's stdout and stderr are relayed line by line. Its own lines "srun: error: NODE: task K:
//    CAUSE" name failed tasks; the first is the root cause (one task per node, so task K is node K
//    of the step). "srun: error: Node failure on NODE" names a node Slurm declared lost.
//  - SIGUSR1 to the launcher goes to srun, which forwards it to the agents (and they to every
//    rank); the job goes on. SIGINT, SIGTERM, SIGHUP: srun gets SIGTERM (it cancels the step), the
//    outcome is kInterrupted with exit code 128 + signal.
//  - Teardown is bounded: after the first failure srun (--kill-on-bad-exit) cancels the step; from
//    then on, or from an interrupt, it has grace + 10 s to exit, else it is killed and the step is
//    cancelled with `scancel --signal=KILL JOB.STEP`. The step then has 10 s to leave squeue; one
//    still listed after that waits for a node that no longer answers (Slurm ends it when it
//    declares the node down) and is named on stderr.
//  - Exit code: the root cause's (the failed agent's, which is its failed rank's) when srun names
//    it, else srun's; 128 + signal when interrupted.

#include <string>
#include <vector>

#include "launcher/restart.h"

namespace dstrain::launcher {

struct SrunStep {
  std::vector<std::string> argv;   // the srun command (slurm.h: srun_command); argv[0] a path
  std::vector<std::string> nodes;  // node k of the step
  int nproc = 1;                   // ranks per node (the ranks a failed node held, in the cause)
  std::string job_id;              // SLURM_JOB_ID
  std::string name;                // the step's name (srun --job-name), to find it in squeue
  double grace_seconds = 5.0;
};

AttemptOutcome run_srun_step(const SrunStep& step);

// Whether a node of the allocation can run a step again.
struct NodeCheck {
  std::string node;
  bool usable = false;
  std::string why;  // when not usable: what was found
};

// Checks every node in parallel, bounded by `timeout_s`: still in the job's node list (a node Slurm
// declared down leaves it, with `sbatch --no-kill`), not DOWN, DRAINED, FAILED or NOT_RESPONDING
// (sinfo), and `srun --overlap -w NODE -N1 -n1 true` exits 0 within the timeout (a node whose
// slurmd is gone but not yet noticed by slurmctld fails here).
std::vector<NodeCheck> check_slurm_nodes(const std::string& job_id,
                                         const std::vector<std::string>& nodes, double timeout_s);

}  // namespace dstrain::launcher
