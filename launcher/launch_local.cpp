#include "launcher/launch_local.h"

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "config/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/run_files.h"
#include "core/secrets.h"
#include "launcher/free_port.h"
#include "launcher/output.h"
#include "launcher/program_path.h"
#include "launcher/shell_quote.h"
#include "launcher/stage_inputs.h"
#include "launcher/supervisor.h"

namespace dstrain::launcher {

void check_local_options(const LocalLaunchOptions& o) {
  if (o.nproc < 1) fail(ErrorKind::kUsage, "--nproc must be >= 1, got {}", o.nproc);
  if (o.master_port != 0) check_port(o.master_port, "--master-port");
  if (!std::isfinite(o.grace_seconds) || o.grace_seconds < 0) {
    fail(ErrorKind::kUsage, "--grace must be a number of seconds >= 0, got {}", o.grace_seconds);
  }
  if (o.exec && !o.stage_dir.empty()) {
    fail(ErrorKind::kUsage,
         "--stage-dir stages the model and data of a config; it does not apply to --exec");
  }
  if (o.exec) {
    if (o.args.empty())
      fail(ErrorKind::kUsage, "--exec needs a program: --exec -- PROGRAM [ARGS...]");
    if (!o.config_path.empty() || !o.overrides.empty()) {
      fail(ErrorKind::kUsage,
           "--exec runs a program instead of 'dstrain train': CONFIG and --set "
           "do not apply (put the program after --)");
    }
    return;
  }
  if (o.config_path.empty()) {
    fail(ErrorKind::kUsage,
         "missing CONFIG: dstrain launch --nproc N CONFIG (or --exec -- PROGRAM)");
  }
  if (!std::filesystem::is_regular_file(o.config_path)) {
    fail(ErrorKind::kInput, "config file {} does not exist or is not a file", o.config_path);
  }
}

namespace {

config::Config load_run_config(const LocalLaunchOptions& o, int world_size) {
  config::LoadOptions load;
  load.overrides = o.overrides;
  load.world_size = world_size;
  return config::load_config(o.config_path, load);
}

// "stage: <what>" → "stage: node <host>: <what>".
std::string name_node(const std::string& message, const std::string& host) {
  const std::string prefix = "stage: ";
  std::string rest = message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
  return prefix + "node " + host + ": " + rest;
}

}  // namespace

config::ParallelSection validate_config(const LocalLaunchOptions& o, int world_size) {
  return load_run_config(o, world_size).parallel;
}

void stage_node_inputs(const LocalLaunchOptions& o, int world_size, const std::string& host,
                       std::vector<RankSpec>& ranks) {
  if (o.exec) return;
  const config::Config config = load_run_config(o, world_size);
  const std::string dir = stage_dir_of(o.stage_dir, config);
  if (dir.empty()) return;
  StageReport report;
  try {
    report = stage_inputs(config, dir);
  } catch (const Error& e) {
    throw Error(e.kind(), name_node(e.what(), host));
  }
  write_all(2, format_stage_report(report, host, dir));
  for (RankSpec& rank : ranks)
    rank.env.insert(rank.env.end(), report.env.begin(), report.env.end());
}

std::vector<std::string> rank_command(const LocalLaunchOptions& o) {
  if (o.exec) {
    std::vector<std::string> command = o.args;
    command[0] = resolve_program(o.args[0]);
    return command;
  }
  std::string worker = worker_executable();
  if (::access(worker.c_str(), X_OK) != 0) {
    fail(ErrorKind::kIo,
         "{} is missing or not executable: ranks run 'dstrain-worker train', which "
         "is installed beside dstrain",
         worker);
  }
  std::vector<std::string> command = {worker, "train", o.config_path};
  for (const std::string& kv : o.overrides) {
    command.push_back("--set");
    command.push_back(kv);
  }
  command.insert(command.end(), o.args.begin(), o.args.end());
  return command;
}

bool wants_shared_gpu(const LocalLaunchOptions& options) {
  const char* env = std::getenv("DSTRAIN_SHARE_GPU");
  const std::string value = env ? env : "";
  if (value != "" && value != "0" && value != "1")
    fail(ErrorKind::kUsage, "environment variable DSTRAIN_SHARE_GPU='{}': expected 0 or 1", value);
  return options.share_gpu || value == "1";
}

void add_shared_gpu_env(WorldPlan& plan) {
  const char* ifname = std::getenv("NCCL_SOCKET_IFNAME");
  for (RankSpec& rank : plan.ranks) {
    rank.env.emplace_back("DSTRAIN_SHARE_GPU", "1");
    rank.env.emplace_back("NCCL_HOSTID", fmt::format("dstrain-shared-gpu-rank-{}", rank.rank));
    if (ifname == nullptr || *ifname == '\0') rank.env.emplace_back("NCCL_SOCKET_IFNAME", "lo");
  }
}

WorldPlan plan_local_launch(const LocalLaunchOptions& options) {
  check_local_options(options);
  const config::ParallelSection parallel =
      options.exec ? config::ParallelSection{} : validate_config(options, options.nproc);
  PlanRequest request;
  request.nodes = {NodeSpec{"localhost", options.nproc, {}}};
  request.master_addr = options.master_addr;
  request.master_port = options.master_port != 0 ? options.master_port : find_free_port();
  request.command = rank_command(options);
  WorldPlan plan = make_world_plan(request);
  plan.parallel = parallel;
  if (wants_shared_gpu(options)) add_shared_gpu_env(plan);
  return plan;
}

std::string format_plan(const WorldPlan& plan) {
  std::string out = fmt::format("dstrain launch plan: {} rank(s), master {}:{}\n", plan.world_size,
                                plan.master_addr, plan.master_port);
  for (const RankSpec& rank : plan.ranks) {
    out += fmt::format("rank {} on {} (node {}, local rank {})\n", rank.rank, rank.host,
                       rank.node_rank, rank.local_rank);
    std::vector<std::string> env;
    for (const auto& kv : rank.env)
      env.push_back(kv.first + "=" + shell_quote(secrets::shown_value(kv.first, kv.second)));
    std::string env_line;
    for (const std::string& e : env) env_line += (env_line.empty() ? "" : " ") + e;
    out += "  env:     " + env_line + "\n";
    out += "  command: " + secrets::redact(shell_join(rank.argv)) + "\n";
  }
  return out;
}

RunDirs run_dirs(const LocalLaunchOptions& o, int world_size) {
  RunDirs dirs;
  if (o.exec) return dirs;
  const config::Config config = load_run_config(o, world_size);
  dirs.out_dir = config.logging.out_dir;
  dirs.metrics_file = run_files::metrics_file(dirs.out_dir, config.logging.metrics_path);
  dirs.checkpoint_dir = config.checkpoint.dir;
  for (const std::string& arg : o.args)
    dirs.resumes = dirs.resumes || arg.rfind("--resume-from", 0) == 0;
  return dirs;
}

namespace {

AttemptOutcome attempt_outcome(const JobOutcome& job) {
  AttemptOutcome a;
  a.exit_code = job.exit_code;
  switch (job.cause) {
    case JobOutcome::Cause::kSuccess:
      a.kind = AttemptOutcome::Kind::kSuccess;
      break;
    case JobOutcome::Cause::kInterrupted:
      a.kind = AttemptOutcome::Kind::kInterrupted;
      break;
    case JobOutcome::Cause::kRankFailed:
      a.kind = AttemptOutcome::Kind::kFailed;
      break;
  }
  for (const RankReport& r : job.ranks) {
    if (r.rank != job.failed_rank) continue;
    a.rank = r.rank;
    a.host = local_hostname();
    a.cause = describe(r);
  }
  return a;
}

}  // namespace

int run_local_launch(const LocalLaunchOptions& options) {
  check_restart_options(options.restart);
  WorldPlan plan = plan_local_launch(options);
  if (options.dry_run) {
    std::fputs(format_plan(plan).c_str(), stdout);
    std::fputs(format_parallel_groups(plan).c_str(), stdout);
    std::fflush(stdout);
    return 0;
  }
  SupervisorOptions supervise;
  supervise.grace_seconds = options.grace_seconds;
  supervise.silence_limit_seconds = silence_limit_from_env();
  supervise.log_dir = options.log_dir;
  if (!options.log_dir.empty()) fs::create_dirs(options.log_dir);
  const RunDirs dirs = run_dirs(options, plan.world_size);
  return run_with_restarts(options.restart, dirs, [&](int k, const std::string& resume_from) {
    if (k > 0) {  // a fresh plan: another free port, and the checkpoint to resume
      LocalLaunchOptions again = options;
      if (!resume_from.empty()) again.args = with_resume_from(options.args, resume_from);
      plan = plan_local_launch(again);
    }
    std::fflush(stdout);  // rank lines are written to the raw descriptors from here on
    std::fflush(stderr);
    stage_node_inputs(options, plan.world_size, local_hostname(), plan.ranks);
    JobOutcome outcome = run_local_job(plan.ranks, supervise);
    write_all(2, secrets::redact(format_summary(outcome, local_hostname())));
    return attempt_outcome(outcome);
  });
}

}  // namespace dstrain::launcher
