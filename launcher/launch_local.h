#pragma once
// `dstrain launch` on one machine: validate the request, build the world plan, then either print it
// (--dry-run) or spawn and supervise the ranks. The CLI only fills LocalLaunchOptions.

#include <string>
#include <vector>

#include "launcher/plan.h"
#include "launcher/restart.h"

namespace dstrain::launcher {

struct LocalLaunchOptions {
  int nproc = 1;
  std::string config_path;             // train mode: the run's YAML file
  std::vector<std::string> overrides;  // train mode: "key.path=value", passed on as --set
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port
  std::string log_dir;  // "": no per-rank log files
  bool dry_run = false;
  double grace_seconds = 5.0;
  bool exec = false;              // run `args` (a program) instead of `dstrain train`
  std::vector<std::string> args;  // train mode: extra args for every rank; exec: program + args
  std::string stage_dir;          // --stage-dir (stage_inputs.h); "" = the config's data.stage_dir
  RestartOptions restart;         // --max-restarts, --restart-backoff (restart.h)
  bool share_gpu = false;         // --share-gpu, or DSTRAIN_SHARE_GPU=1 (add_shared_gpu_env)
};

// --share-gpu: every local rank computes on the first visible GPU, for checking multi-rank code
// (ZeRO's collectives, sequence parallelism, restarts) on a machine with one GPU. NCCL refuses two
// ranks on one device of one host, so each rank also gets its own NCCL_HOSTID (NCCL then takes
// the ranks for separate hosts and connects them with its socket transport) and, unless the
// environment names one, NCCL_SOCKET_IFNAME=lo. Each rank gets DSTRAIN_SHARE_GPU=1 (the device
// override of train/device.h). LOCAL_RANK stays distinct. The step time of N ranks sharing a GPU
// says nothing about N GPUs.
void add_shared_gpu_env(WorldPlan& plan);

// Whether the ranks share one GPU: --share-gpu or DSTRAIN_SHARE_GPU=1 in this environment (any
// other value than 0, 1 or empty is Error(kUsage)).
bool wants_shared_gpu(const LocalLaunchOptions& options);

// Checks the flags shared by every launch mode (ports, grace, --exec vs CONFIG, the config file
// exists). Error(kUsage/kInput).
void check_local_options(const LocalLaunchOptions& options);

// The argv every rank runs: `dstrain-worker train CONFIG --set ... ARGS` (the worker beside this
// binary; Error(kIo) when it is missing), or with --exec the program resolved on PATH followed by
// its arguments.
std::vector<std::string> rank_command(const LocalLaunchOptions& options);

// Loads the config once (with `world_size` ranks), so an error is reported once, not per rank.
// Returns its parallel section (for the plan's groups).
config::ParallelSection validate_config(const LocalLaunchOptions& options, int world_size);

// Node-local staging for the ranks of one node (stage_inputs.h): when --stage-dir or the config's
// data.stage_dir names a directory, stages the run's inputs there, prints the report on stderr
// naming `host`, and adds the staged variables to every rank in `ranks`. Nothing for --exec or
// without a stage directory. Error(kInput) "stage: node <host>: ..." when staging fails.
void stage_node_inputs(const LocalLaunchOptions& options, int world_size, const std::string& host,
                       std::vector<RankSpec>& ranks);

// Checks everything that can be checked before spawning (flags, the config via load_config, the
// program for --exec) and builds the plan. Throws Error(kUsage/kConfig/kInput) for bad input.
WorldPlan plan_local_launch(const LocalLaunchOptions& options);

// The plan as printed by --dry-run: each rank with its environment and command, shell-quoted, and
// secret values redacted (core/secrets.h).
std::string format_plan(const WorldPlan& plan);

// Where the run's config puts its outputs and checkpoints (with `world_size` ranks); nothing for
// --exec.
RunDirs run_dirs(const LocalLaunchOptions& options, int world_size);

// Runs the launch and returns the process exit code: 0, a failed rank's code (128 + signal), or
// 128 + signal when the launcher was interrupted. Prints the summary on stderr. With
// options.restart.max_restarts > 0 a failed job is restarted from `latest` (restart.h).
int run_local_launch(const LocalLaunchOptions& options);

}  // namespace dstrain::launcher
