#pragma once
// `dstrain resume CKPT`: how a checkpoint's job is started again. By default the way its launch
// record (launch_record.h, beside the checkpoint) says the job was launched: over SSH from the
// recorded hostfile and host selection, inside a Slurm allocation over the allocation's nodes, or
// on this machine, with the recorded ranks per node and launch flags. Flags override:
//
//   --local            on this machine: --nproc ranks, else the checkpoint's world size
//   --hostfile FILE    over SSH from FILE (with --include/--exclude/--num_nodes/--num_gpus)
//   --slurm            over the nodes of the allocation this runs in
//   --nproc N          ranks (local) or ranks per node (Slurm; over SSH the first N slots of every
//                      host, as --num_gpus N)
//   --include/--exclude/--num_nodes/--num_gpus   another selection of the (recorded) hostfile
//   --min-nodes, --max-restarts, --restart-backoff, --master-addr, --master-port, --log-dir
//
// A different world size re-shards on load, as any resume. A checkpoint without a record (written
// before launches were recorded) resumes on this machine with its world size, and says so.
//
// Errors (exit 2, nothing started): flags that exclude each other; the hostfile missing; a Slurm
// record outside an allocation; hosts that do not answer (run_resume_launch), unless --min-nodes
// M lets the job go on without them (at least M hosts answer): then they are left out and the
// global batch of the checkpoint is kept as after a restart that shrank the world
// (elastic_batch.h).

#include <optional>
#include <string>
#include <vector>

#include "launcher/launch.h"
#include "launcher/launch_record.h"

namespace dstrain::launcher {

// What the user typed after `dstrain resume CKPT`.
struct ResumeRequest {
  bool local = false;
  bool slurm = false;
  std::string hostfile;
  HostSelection selection;  // --include/--exclude/--num_nodes/--num_gpus
  int nproc = 0;            // 0 = as recorded
  int min_nodes = -1;       // -1 = as recorded (for this and the three below)
  int max_restarts = -1;
  double restart_backoff = -1;
  std::string master_addr;             // "" = as recorded
  int master_port = 0;                 // 0 = as recorded
  std::string log_dir;                 // "" = as recorded
  std::vector<std::string> overrides;  // --set
  bool dry_run = false;
};

struct ResumeCheckpoint {
  std::string tag_dir;      // the complete checkpoint, absolute
  std::string config_path;  // its config.yaml (ckpt/layout.h names the file)
  int world_size = 1;       // its manifest's world size
  std::string record_path;  // where its launch record is (or would be), for messages
  std::optional<LaunchRecord> record;
};

// Where `dstrain resume` runs: inside a Slurm allocation or not.
struct ResumeEnvironment {
  bool in_slurm_allocation = false;  // SLURM_JOB_ID set
  int slurm_nodes = 0;               // the allocation's node count
  std::string cwd;                   // this directory
  // NAME=VALUE of this process's variables of the kind a launch record keeps
  // (recorded_environment in launch_record.h)
  std::vector<std::string> variables;
};

struct ResumePlan {
  LaunchOptions options;  // for run_launch: the checkpoint's config.yaml, --resume-from its tag
  LaunchMode mode = LaunchMode::kLocal;
  std::string how;                 // "over SSH from ... (as recorded)", for the first line
  std::vector<std::string> notes;  // one line each, printed before the launch
  // NAME=VALUE: recorded variables this process lacks, set in its environment before the launch
  // so that the ranks get them as at the launch (a resume from a new shell)
  std::vector<std::string> set_env;
  int checkpoint_world_size = 1;
};

// Decides the launch. Error(kUsage) for flags that exclude each other or a Slurm launch outside an
// allocation, Error(kInput) when the hostfile to use does not exist.
ResumePlan plan_resume(const ResumeRequest& request, const ResumeCheckpoint& checkpoint,
                       const ResumeEnvironment& environment);

// Runs the plan through run_launch. Over SSH (not a dry run) every host is probed first, in
// parallel: hosts that do not answer are Error(kInput) naming them, or left out under --min-nodes
// (see above). Returns the launch's exit code.
int run_resume_launch(ResumePlan plan);

}  // namespace dstrain::launcher
