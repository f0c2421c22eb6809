#include "launcher/resume_plan.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "core/secrets.h"
#include "launcher/elastic_batch.h"
#include "launcher/output.h"
#include "launcher/program_path.h"
#include "launcher/ssh_job.h"

extern char** environ;

namespace dstrain::launcher {
namespace {

namespace stdfs = std::filesystem;

bool selection_given(const HostSelection& s) {
  return !s.include.empty() || !s.exclude.empty() || s.num_nodes != -1 || s.num_gpus != -1;
}

LaunchMode chosen_mode(const ResumeRequest& r, const ResumeCheckpoint& c) {
  if (static_cast<int>(r.local) + static_cast<int>(r.slurm) +
          static_cast<int>(!r.hostfile.empty()) >
      1) {
    fail(ErrorKind::kUsage, "--local, --slurm and --hostfile exclude each other");
  }
  if (r.local) return LaunchMode::kLocal;
  if (r.slurm) return LaunchMode::kSlurm;
  if (!r.hostfile.empty()) return LaunchMode::kSsh;
  return c.record ? c.record->mode : LaunchMode::kLocal;
}

// What the record says about any launch; with `same_mode` also what only means something in the
// recorded mode (master address and port, --min-nodes, --elastic-batch).
void adopt_recorded_flags(const LaunchRecord& r, bool same_mode, LaunchOptions& o) {
  o.secret_env = r.secret_env;
  o.launch.log_dir = r.log_dir;
  o.launch.stage_dir = r.stage_dir;
  o.launch.grace_seconds = r.grace_seconds;
  o.launch.restart = r.restart;
  if (!same_mode) return;
  if (!r.master_addr.empty()) {
    o.launch.master_addr = r.master_addr;
    o.master_addr_given = true;
  }
  o.launch.master_port = r.master_port;
  o.min_nodes = r.min_nodes;
  o.allow_batch_change = r.allow_batch_change;
}

void apply_flags(const ResumeRequest& r, LaunchOptions& o) {
  if (r.max_restarts >= 0) o.launch.restart.max_restarts = r.max_restarts;
  if (r.restart_backoff >= 0) o.launch.restart.backoff_seconds = r.restart_backoff;
  if (r.min_nodes >= 0) o.min_nodes = r.min_nodes;
  if (!r.master_addr.empty()) {
    o.launch.master_addr = r.master_addr;
    o.master_addr_given = true;
  }
  if (r.master_port != 0) o.launch.master_port = r.master_port;
  if (!r.log_dir.empty()) o.launch.log_dir = r.log_dir;
  o.launch.overrides = r.overrides;
  o.launch.dry_run = r.dry_run;
}

std::string selection_text(const HostSelection& s) {
  std::string out;
  if (!s.include.empty()) out += " --include " + s.include;
  if (!s.exclude.empty()) out += " --exclude " + s.exclude;
  if (s.num_nodes >= 0) out += fmt::format(" --num_nodes {}", s.num_nodes);
  if (s.num_gpus >= 0) out += fmt::format(" --num_gpus {}", s.num_gpus);
  return out;
}

void plan_ssh(const ResumeRequest& r, const ResumeCheckpoint& c, ResumePlan& p) {
  LaunchOptions& o = p.options;
  const LaunchRecord* rec = c.record && c.record->mode == LaunchMode::kSsh ? &*c.record : nullptr;
  if (rec != nullptr) {  // the same cluster: its SSH settings, variables and directory
    o.env = rec->env;
    o.remote_cwd = rec->remote_cwd;
    o.ssh = rec->ssh;
  }
  o.hostfile = r.hostfile.empty() ? rec->hostfile : stdfs::absolute(r.hostfile).string();
  if (r.hostfile.empty()) o.selection = rec->selection;
  if (selection_given(r.selection)) o.selection = r.selection;
  if (r.nproc > 0) {
    if (!o.selection.include.empty() || !o.selection.exclude.empty()) {
      fail(ErrorKind::kUsage,
           "--nproc {} over SSH takes the first {} slot(s) of every host (as --num_gpus), which "
           "does not combine with --include/--exclude ({}); name the slots with --include instead",
           r.nproc, r.nproc, selection_text(o.selection).substr(1));
    }
    o.selection.num_gpus = r.nproc;
  }
  std::error_code ec;
  if (!stdfs::is_regular_file(o.hostfile, ec)) {
    if (!r.hostfile.empty()) fail(ErrorKind::kInput, "--hostfile {} does not exist", o.hostfile);
    fail(ErrorKind::kInput,
         "{} was launched over SSH from the hostfile {} (recorded in {}), which does not exist "
         "any more; resume with --hostfile FILE, or with --local on this machine",
         c.tag_dir, o.hostfile, c.record_path);
  }
  p.how = fmt::format("over SSH on the hosts of {}{} ({})", o.hostfile, selection_text(o.selection),
                      r.hostfile.empty() ? "as recorded" : "--hostfile");
  if (rec != nullptr && !rec->env_not_recorded.empty()) {
    std::string names;
    for (const std::string& n : rec->env_not_recorded) names += (names.empty() ? "" : ", ") + n;
    p.notes.push_back(fmt::format(
        "note: the secret --env variable(s) {} of the launch were not recorded; the hosts get "
        "them again from ~/.dstrain_env, ./.dstrain_env or this environment",
        names));
  }
}

void plan_slurm(const ResumeRequest& r, const ResumeCheckpoint& c, const ResumeEnvironment& env,
                ResumePlan& p) {
  const LaunchRecord* rec = c.record && c.record->mode == LaunchMode::kSlurm ? &*c.record : nullptr;
  if (!env.in_slurm_allocation) {
    if (r.slurm)
      fail(ErrorKind::kUsage, "--slurm resumes inside a Slurm allocation; SLURM_JOB_ID is not set");
    fail(ErrorKind::kUsage,
         "{} was launched {}; run `dstrain resume` inside a Slurm allocation (sbatch, salloc) to "
         "resume over its nodes, or resume with --hostfile FILE or --local",
         c.tag_dir, describe_launch(*rec));
  }
  int nproc = r.nproc > 0 ? r.nproc : rec != nullptr ? rec->nproc : 0;
  if (nproc == 0 && env.slurm_nodes > 0 && c.world_size % env.slurm_nodes == 0)
    nproc = c.world_size / env.slurm_nodes;
  if (nproc == 0) {
    fail(ErrorKind::kUsage,
         "--slurm: the checkpoint has {} rank(s) and the allocation {} node(s); give the ranks "
         "per node with --nproc",
         c.world_size, env.slurm_nodes);
  }
  p.options.slurm = true;
  p.options.launch.nproc = nproc;
  p.how = fmt::format("under Slurm over the allocation's {} node(s), {} rank(s) each ({})",
                      env.slurm_nodes, nproc, r.slurm ? "--slurm" : "as recorded");
}

void plan_local(const ResumeRequest& r, const ResumeCheckpoint& c, ResumePlan& p) {
  const bool recorded = c.record && c.record->mode == LaunchMode::kLocal;
  p.options.no_slurm = true;  // on this machine even inside an allocation
  p.options.launch.nproc = r.nproc > 0 ? r.nproc : recorded ? c.record->nproc : c.world_size;
  const char* source = r.local       ? "--local"
                       : r.nproc > 0 ? "--nproc"
                       : recorded    ? "as recorded"
                                     : "the checkpoint's world size";
  p.how = fmt::format("on this machine with {} rank(s) ({})", p.options.launch.nproc, source);
  if (!c.record && !r.local) {
    p.notes.push_back(fmt::format(
        "note: no launch record ({} does not exist; checkpoints written before dstrain recorded "
        "launches have none): resuming on this machine; --hostfile or --slurm resume on several "
        "nodes",
        c.record_path));
  }
}

}  // namespace

// The recorded variables (NAME=VALUE) this process lacks go into p.set_env, with one note naming
// them; one note for each that this process has with another value (this process's is kept).
void restore_environment(const std::vector<std::string>& recorded,
                         const std::vector<std::string>& current, ResumePlan& p) {
  std::map<std::string, std::string> here;
  for (const std::string& kv : current)
    here[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  std::string missing;
  for (const std::string& kv : recorded) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = kv.substr(0, eq), value = kv.substr(eq + 1);
    const auto it = here.find(name);
    if (it == here.end()) {
      p.set_env.push_back(kv);
      missing += (missing.empty() ? "" : ", ") + name;
    } else if (it->second != value) {
      p.notes.push_back(fmt::format(
          "note: {} is '{}' in this environment and was '{}' at the launch; the ranks get '{}'",
          name, it->second, value, it->second));
    }
  }
  if (!missing.empty()) {
    p.notes.push_back(
        fmt::format("note: {} not set in this environment; the ranks get the values of the launch "
                    "(launch.json)",
                    missing));
  }
}

ResumePlan plan_resume(const ResumeRequest& r, const ResumeCheckpoint& c,
                       const ResumeEnvironment& env) {
  if (r.nproc < 0) fail(ErrorKind::kUsage, "--nproc must be >= 1, got {}", r.nproc);
  ResumePlan p;
  p.mode = chosen_mode(r, c);
  p.checkpoint_world_size = c.world_size;
  if (selection_given(r.selection) && p.mode != LaunchMode::kSsh) {
    fail(ErrorKind::kUsage,
         "--include/--exclude/--num_nodes/--num_gpus select hosts of a hostfile: they need "
         "--hostfile, or a job launched over SSH");
  }
  if (c.record) adopt_recorded_flags(*c.record, c.record->mode == p.mode, p.options);
  if (p.mode == LaunchMode::kSsh) plan_ssh(r, c, p);
  if (p.mode == LaunchMode::kSlurm) plan_slurm(r, c, env, p);
  if (p.mode == LaunchMode::kLocal) plan_local(r, c, p);
  apply_flags(r, p.options);
  p.options.launch.config_path = c.config_path;
  p.options.launch.args = {"--resume-from", c.tag_dir};
  if (c.record) restore_environment(c.record->environment, env.variables, p);
  if (c.record && !c.record->cwd.empty() && c.record->cwd != env.cwd) {
    p.notes.push_back(fmt::format(
        "note: the job was launched from {}; relative paths of its config are read from here, {}",
        c.record->cwd, env.cwd));
  }
  return p;
}

namespace {

// Over SSH: probes every host; those that do not answer are an error, or left out under
// --min-nodes with the checkpoint's global batch kept.
void leave_out_silent_hosts(ResumePlan& p) {
  LaunchOptions& o = p.options;
  const MultiNodePlan plan = plan_multi_node(multi_node_options(o), environ);
  std::vector<std::string> lost;
  std::string why;
  for (const HostCheck& c : probe_hosts(plan, o.ssh, launcher_executable())) {
    if (c.reachable) continue;
    lost.push_back(c.host);
    why += fmt::format("\n  {}: {}", c.host, c.text);
  }
  if (lost.empty()) return;
  const int total = static_cast<int>(plan.nodes.size());
  const int remaining = total - static_cast<int>(lost.size());
  if (o.min_nodes == 0) {
    fail(ErrorKind::kInput,
         "{} of {} host(s) of {} do not answer:{}\nresuming needs every host: give --min-nodes M "
         "to go on without them while at least M answer (the global batch is kept), leave them "
         "out with --exclude, or resume with --hostfile FILE or --local",
         lost.size(), total, o.hostfile, secrets::redact(why));
  }
  if (remaining < o.min_nodes) {
    fail(ErrorKind::kInput, "only {} of {} host(s) of {} answer, fewer than --min-nodes {}:{}",
         remaining, total, o.hostfile, o.min_nodes, secrets::redact(why));
  }
  int world = 0;
  for (const SelectedNode& n : plan.nodes) {
    if (std::find(lost.begin(), lost.end(), n.entry.host) == lost.end())
      world += static_cast<int>(n.slots.size());
  }
  for (const std::string& host : lost) {
    write_all(2, fmt::format("dstrain resume: host {} does not answer: left out ({} of {} host(s) "
                             "remain, --min-nodes {})\n",
                             host, remaining, total, o.min_nodes));
  }
  o.left_out = lost;
  for (const std::string& kv :
       batch_overrides(o.launch, o.allow_batch_change, p.checkpoint_world_size, world))
    o.launch.overrides.push_back(kv);
}

}  // namespace

int run_resume_launch(ResumePlan plan) {
  for (const std::string& kv : plan.set_env) {
    const size_t eq = kv.find('=');
    ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  if (plan.mode == LaunchMode::kSsh && !plan.options.launch.dry_run) leave_out_silent_hosts(plan);
  return run_launch(plan.options);
}

}  // namespace dstrain::launcher
