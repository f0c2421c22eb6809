#pragma once
// How a training job was launched, kept beside its checkpoints so that `dstrain resume` can start
// it again the same way: over SSH from the same hostfile, inside a Slurm allocation, or on this
// machine, with the same ranks per node and the launch flags that shape the job.
//
// Where: <checkpoint.dir>/launch.json, next to `latest`. Who: the root launcher (`dstrain launch`,
// and `dstrain resume`, which launches through it), on the machine where it is typed, before any
// rank starts; never a dry run, a node agent or --exec. The launcher is the one process that knows
// how the job was started, and a restart (--max-restarts) or a Slurm requeue runs the same launch
// again, so the record never goes stale within one launch; the next launch into the same directory
// replaces it (a resume with --local is then recorded as local). Its contents are the same on every
// attempt, so a crash while writing it leaves the old file or the new one (written atomically).
//
// The launcher's own variables that reach the ranks (remote_env.h's forwarded prefixes: DSTRAIN_,
// HF_, NCCL_, CUDA_, ...) are recorded too, so that a resume from a new shell gives the ranks the
// same DSTRAIN_DEVICE, HF_HOME, NCCL_SOCKET_IFNAME (resume_plan.h).
//
// What is not recorded: config overrides (--set; the checkpoint's config.yaml already holds them),
// the arguments after `--`, and secret values: an `--env NAME=VALUE` whose NAME is secret
// (core/secrets.h) is dropped, its name kept in env_not_recorded, a secret variable of the
// launcher's environment is left out, and --secret-env keeps names only. Paths (hostfile, key,
// known_hosts, log and stage dirs) are stored absolute.

#include <optional>
#include <string>
#include <vector>

#include "launcher/host_select.h"
#include "launcher/launch.h"
#include "launcher/restart.h"
#include "launcher/ssh_client.h"

namespace dstrain::launcher {

inline constexpr const char* kLaunchRecordFile = "launch.json";

enum class LaunchMode { kLocal, kSsh, kSlurm };

const char* mode_name(LaunchMode mode);  // "local", "ssh", "slurm"

struct LaunchRecord {
  LaunchMode mode = LaunchMode::kLocal;
  std::string cwd;     // the launcher's working directory (relative paths of the config)
  int world_size = 0;  // ranks the job started with
  // local: ranks; Slurm: ranks per node; SSH: unused (the hostfile's slots decide).
  int nproc = 1;
  // SSH
  std::string hostfile;  // absolute
  HostSelection selection;
  std::string remote_cwd;  // --remote-cwd as given ("" = the launcher's directory)
  SshSettings ssh;
  std::vector<std::string> env;               // --env KEY=VALUE, secret ones left out
  std::vector<std::string> env_not_recorded;  // the names of the secret --env entries
  // Slurm, for messages: the job and its node count
  std::string slurm_job_id;
  int slurm_nodes = 0;
  // every mode
  std::vector<std::string> hosts;       // the hosts (SSH) or "localhost" the job started on
  std::string master_addr;              // "" = not given (each mode's default)
  int master_port = 0;                  // 0 = not given
  std::vector<std::string> secret_env;  // --secret-env names
  // NAME=VALUE of the launcher's forwarded variables (see above), secret ones left out; sorted
  std::vector<std::string> environment;
  std::string log_dir;    // absolute, "" = none
  std::string stage_dir;  // absolute, "" = the config's data.stage_dir
  double grace_seconds = 5.0;
  RestartOptions restart;
  int min_nodes = 0;
  bool allow_batch_change = false;
};

// `<checkpoint_dir>/launch.json`.
std::string launch_record_path(const std::string& checkpoint_dir);

// The record as JSON text (format "dstrain-launch", version 1) and back. parse: Error(kInput)
// naming `path` and the key for malformed JSON, a wrong type, an unknown mode or a newer version.
std::string to_json(const LaunchRecord& record);
LaunchRecord parse_launch_record(const std::string& text, const std::string& path);

// Writes the record into `checkpoint_dir` (created if needed; temp + fsync + rename).
// Error(kIo) when it cannot.
void write_launch_record(const std::string& checkpoint_dir, const LaunchRecord& record);

// The record of `checkpoint_dir`, or nullopt when it has none (a checkpoint written before
// launches were recorded). Error(kInput) when the file is there but unreadable or malformed.
std::optional<LaunchRecord> read_launch_record(const std::string& checkpoint_dir);

// What a launch with `options` in `mode` records; `world_size` and `hosts` as planned. Paths are
// made absolute against the current directory.
LaunchRecord record_of(const LaunchOptions& options, LaunchMode mode, int world_size,
                       const std::vector<std::string>& hosts);
// The variables of `environ` a launch record keeps (see above), as NAME=VALUE.
std::vector<std::string> recorded_environment(const char* const* env,
                                              const std::vector<std::string>& secret_names);

// One line for people: "over SSH on 2 host(s) of /home/u/hosts (--exclude b), 16 rank(s)",
// "under Slurm (job 812): 2 node(s) x 8 rank(s)", "on one machine: 4 rank(s)".
std::string describe_launch(const LaunchRecord& record);

}  // namespace dstrain::launcher
