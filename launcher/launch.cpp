#include "launcher/launch.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "config/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/secrets.h"
#include "core/shared_files.h"
#include "launcher/hostfile.h"
#include "launcher/hostlist.h"
#include "launcher/launch_record.h"
#include "launcher/multi_node.h"
#include "launcher/node_agent.h"
#include "launcher/output.h"
#include "launcher/remote_env.h"
#include "launcher/slurm.h"

extern char** environ;

namespace dstrain::launcher {
namespace {

namespace stdfs = std::filesystem;

int run_agent(const LaunchOptions& o) {
  AgentOptions agent;
  agent.launch = o.launch;
  agent.watch_stdin = o.watch_stdin;
  agent.env_on_stdin = o.env_on_stdin;
  agent.keepalive_seconds = o.ssh.keepalive_seconds;
  if (o.slurm_agent) {
    SlurmAgentPlacement p = slurm_agent_placement(current_environment());
    agent.node_rank = p.node_rank;
    agent.host = p.host;
    agent.nodes_nproc.assign(static_cast<size_t>(p.num_nodes), o.launch.nproc);
  } else {
    agent.node_rank = o.node_rank;
    agent.host = o.node_host;
    agent.nodes_nproc = parse_int_list(o.nodes_nproc, "--nodes-nproc", 1);
    agent.devices = parse_int_list(o.node_devices, "--node-devices", 0);
  }
  return run_node_agent(agent);
}

void reject_multi_node_flags(const LaunchOptions& o) {
  const HostSelection& s = o.selection;
  bool given = !s.include.empty() || !s.exclude.empty() || s.num_nodes != -1 || s.num_gpus != -1 ||
               !o.env.empty() || !o.remote_cwd.empty() || o.check || !o.ssh.key_file.empty() ||
               o.min_nodes != 0 || o.allow_batch_change;
  if (given) {
    fail(ErrorKind::kUsage,
         "--include/--exclude/--num_nodes/--num_gpus/--env/--remote-cwd/--check/--ssh-key/"
         "--min-nodes/--elastic-batch need --hostfile (--min-nodes and --elastic-batch also work "
         "under Slurm)");
  }
}

// --secret-env names join the secret ones here, their values are learnt from the environment, and
// DSTRAIN_REDACT_VARS carries every added name to what this process starts (ranks inherit it; over
// SSH it is forwarded like any DSTRAIN_ variable; srun passes the environment on).
void adopt_secret_names(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (!is_env_name(name))
      fail(ErrorKind::kUsage, "--secret-env expects a variable name, got '{}'", name);
  }
  secrets::add_secret_names(names);
  secrets::learn_environment(environ);
  const std::vector<std::string> all = secrets::added_secret_names();
  if (all.empty()) return;
  const std::string value = secrets::join_names(all);
  if (::setenv(secrets::kExtraNamesVariable, value.c_str(), 1) != 0) {
    fail(ErrorKind::kIo, "cannot set {}: {}", secrets::kExtraNamesVariable, std::strerror(errno));
  }
}

bool in_slurm_allocation(const LaunchOptions& o) {
  if (o.no_slurm) return false;
  const char* job = std::getenv("SLURM_JOB_ID");
  return o.slurm || (job != nullptr && *job != '\0');
}

// --share-gpu puts the ranks of this one machine on its one GPU; a multi-node job has a GPU per
// rank.
void reject_shared_gpu_beyond_one_machine(const LaunchOptions& o) {
  if (!wants_shared_gpu(o.launch)) return;
  const char* where = !o.hostfile.empty()      ? "--hostfile"
                      : in_slurm_allocation(o) ? "a Slurm allocation (--no-slurm runs the ranks "
                                                 "on this machine)"
                                               : nullptr;
  if (where) {
    fail(ErrorKind::kUsage,
         "--share-gpu (or DSTRAIN_SHARE_GPU=1) runs every rank of one machine on its one GPU, for "
         "checking multi-rank code; it does not apply to {}",
         where);
  }
}

// The world a launch in `mode` plans, before it is planned in full: its size and its hosts. Size 0
// under Slurm without the allocation's variables (run_slurm_launch then names the missing one).
struct PlannedWorld {
  int size = 0;
  std::vector<std::string> hosts;
};

PlannedWorld planned_world(const LaunchOptions& o, LaunchMode mode) {
  PlannedWorld w;
  if (mode == LaunchMode::kSsh) {
    for (const SelectedNode& n : select_hosts(read_hostfile(o.hostfile), o.selection, o.hostfile)) {
      if (std::find(o.left_out.begin(), o.left_out.end(), n.entry.host) != o.left_out.end())
        continue;
      w.size += static_cast<int>(n.slots.size());
      w.hosts.push_back(n.entry.host);
    }
  } else if (mode == LaunchMode::kSlurm) {
    const char* list = std::getenv("SLURM_JOB_NODELIST");
    if (list == nullptr || *list == '\0') return w;
    w.hosts = expand_hostlist(list);
    w.size = static_cast<int>(w.hosts.size()) * o.launch.nproc;
  } else {
    w.size = o.launch.nproc;
    w.hosts = {"localhost"};
  }
  return w;
}

// Where the ranks find the config's checkpoint.dir: a relative one is read in --remote-cwd over
// SSH, else in this directory (where the local and Slurm ranks run).
std::string checkpoint_dir_of(const LaunchOptions& o, LaunchMode mode, const std::string& dir) {
  if (mode == LaunchMode::kSsh && !o.remote_cwd.empty() && stdfs::path(dir).is_relative())
    return (stdfs::path(o.remote_cwd) / dir).string();
  return stdfs::absolute(dir).string();
}

// --resume-latest: `--resume-from <dir>/latest` for every rank when `latest` exists.
void resume_from_latest(LocalLaunchOptions& l, const std::string& checkpoint_dir) {
  for (const std::string& arg : l.args) {
    if (arg.rfind("--resume-from", 0) == 0)
      fail(ErrorKind::kUsage, "--resume-latest and --resume-from (after --) exclude each other");
  }
  const std::string latest = (stdfs::path(checkpoint_dir) / shared_files::kLatest).string();
  const std::optional<std::string> tag = shared_files::read_latest(checkpoint_dir);
  if (!tag) {
    write_all(2, fmt::format("dstrain launch: --resume-latest: no checkpoint in {} yet: starting "
                             "at step 0\n",
                             checkpoint_dir));
    return;
  }
  write_all(2, fmt::format("dstrain launch: resuming from {} ({})\n", latest, *tag));
  l.args.insert(l.args.begin(), {"--resume-from", latest});
}

// A training launch, before its mode runs it: --resume-latest, then the launch record beside the
// checkpoints (launch_record.h). A record that cannot be written is a warning: the job itself does
// not need it.
void prepare_training_launch(LaunchOptions& o, LaunchMode mode) {
  if (o.launch.exec) {
    if (o.resume_latest)
      fail(ErrorKind::kUsage, "--resume-latest resumes a training config; not with --exec");
    return;
  }
  if (o.launch.dry_run && !o.resume_latest) return;
  check_local_options(o.launch);
  const PlannedWorld world = planned_world(o, mode);
  if (world.size == 0) return;
  config::LoadOptions load;
  load.overrides = o.launch.overrides;
  load.world_size = world.size;
  const config::Config cfg = config::load_config(o.launch.config_path, load);
  const std::string dir = checkpoint_dir_of(o, mode, cfg.checkpoint.dir);
  if (o.resume_latest) resume_from_latest(o.launch, dir);
  if (o.launch.dry_run || (cfg.checkpoint.interval == 0 && !cfg.checkpoint.save_final)) return;
  try {
    write_launch_record(dir, record_of(o, mode, world.size, world.hosts));
  } catch (const Error& e) {
    write_all(2, secrets::redact(fmt::format(
                     "dstrain launch: warning: cannot record how the job was launched: {}; "
                     "`dstrain resume` of its checkpoints will run on this machine unless told "
                     "otherwise (--hostfile, --slurm)\n",
                     e.what())));
  }
}

}  // namespace

MultiNodeOptions multi_node_options(const LaunchOptions& o) {
  MultiNodeOptions m;
  m.launch = o.launch;
  m.master_addr_given = o.master_addr_given;
  m.hostfile = o.hostfile;
  m.selection = o.selection;
  m.env = o.env;
  m.secret_env = secrets::added_secret_names();
  m.remote_cwd = o.remote_cwd;
  m.ssh = o.ssh;
  m.check = o.check;
  m.min_nodes = o.min_nodes;
  m.allow_batch_change = o.allow_batch_change;
  m.left_out = o.left_out;
  return m;
}

int run_launch(const LaunchOptions& options) {
  if (options.slurm && options.no_slurm)
    fail(ErrorKind::kUsage, "--slurm and --no-slurm exclude each other");
  adopt_secret_names(options.secret_env);
  if (options.node_rank >= 0 || options.slurm_agent) return run_agent(options);
  reject_shared_gpu_beyond_one_machine(options);
  LaunchOptions o = options;
  if (!o.hostfile.empty()) {
    if (o.slurm) fail(ErrorKind::kUsage, "--hostfile and --slurm exclude each other");
    prepare_training_launch(o, LaunchMode::kSsh);
    return run_multi_node_launch(multi_node_options(o));
  }
  if (in_slurm_allocation(o)) {
    LaunchOptions ssh_only = o;  // --min-nodes and --elastic-batch apply under Slurm too
    ssh_only.min_nodes = 0;
    ssh_only.allow_batch_change = false;
    reject_multi_node_flags(ssh_only);
    prepare_training_launch(o, LaunchMode::kSlurm);
    SlurmLaunchOptions s;
    s.launch = o.launch;
    s.master_addr_given = o.master_addr_given;
    s.min_nodes = o.min_nodes;
    s.allow_batch_change = o.allow_batch_change;
    return run_slurm_launch(s);
  }
  reject_multi_node_flags(o);
  prepare_training_launch(o, LaunchMode::kLocal);
  return run_local_launch(o.launch);
}

}  // namespace dstrain::launcher
