#include <memory>

#include "apps/dstrain/command_info.h"
#include "apps/dstrain/commands.h"
#include "train/train.h"

namespace dstrain::app {
namespace {

void add_where_flags(CLI::App* cmd, launcher::ResumeRequest* r) {
  const char* group = "Where [default: as the job was launched]";
  cmd->add_flag("--local", r->local, "Resume on this machine")->group(group);
  cmd->add_option("--hostfile", r->hostfile, "Resume over SSH on the hosts of FILE")
      ->type_name("FILE")
      ->group(group);
  cmd->add_flag("--slurm", r->slurm, "Resume over the nodes of the Slurm allocation this runs in")
      ->group(group);
  cmd->add_option("--nproc", r->nproc,
                  "Ranks on this machine, ranks per node under Slurm, or the first N slots of "
                  "every host over SSH [default: as launched; else the checkpoint's world size]")
      ->type_name("N")
      ->group(group);
  cmd->add_option("--include", r->selection.include, "Only these hosts/slots: host1:0,2@host2")
      ->type_name("SPEC")
      ->group(group);
  cmd->add_option("--exclude", r->selection.exclude, "All but these hosts/slots: host1:0@host2")
      ->type_name("SPEC")
      ->group(group);
  cmd->add_option("--num_nodes,--num-nodes", r->selection.num_nodes, "Use the first N hosts")
      ->type_name("N")
      ->group(group);
  cmd->add_option("--num_gpus,--num-gpus", r->selection.num_gpus, "Use the first G slots per host")
      ->type_name("G")
      ->group(group);
  cmd->add_option("--min-nodes", r->min_nodes,
                  "Over SSH: go on without hosts that do not answer while at least M do (the "
                  "global batch is kept); with --max-restarts also after a failure")
      ->type_name("M")
      ->group(group);
}

void add_launch_flags(CLI::App* cmd, launcher::ResumeRequest* r) {
  cmd->add_option("--set", r->overrides, "Config override key.path=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--master-addr,--master_addr", r->master_addr, "MASTER_ADDR given to every rank")
      ->type_name("ADDR");
  cmd->add_option("--master-port,--master_port", r->master_port,
                  "MASTER_PORT given to every rank [default: as launched]")
      ->type_name("PORT");
  cmd->add_option("--log-dir", r->log_dir, "Also write each rank's output to DIR/rank_K.log")
      ->type_name("DIR");
  cmd->add_option("--max-restarts", r->max_restarts,
                  "Restart a failed job from the newest checkpoint, at most N times in a row "
                  "without a new checkpoint [default: as launched]")
      ->type_name("N");
  cmd->add_option("--restart-backoff", r->restart_backoff,
                  "Seconds to wait before a restart [default: as launched]")
      ->type_name("SECONDS");
  cmd->add_flag("--dry-run", r->dry_run, "Print the plan, start nothing");
}

}  // namespace

void set_resume_command(CLI::App& root, int* exit_code) {
  auto* cmd = add_worker_subcommand(root, kResumeCommand);
  cmd->footer(
      "CKPT is <dir>/latest, a checkpoint directory holding 'latest', or a tag directory.\n"
      "The job starts again the way it was launched (over SSH from the same hostfile, under\n"
      "Slurm over the allocation's nodes, or on this machine), as recorded in <dir>/launch.json.\n"
      "Data paths in the saved config are relative to the directory the run was started from.\n"
      "Examples:\n"
      "  dstrain resume runs/tiny/checkpoints/latest\n"
      "  dstrain resume runs/tiny/checkpoints/latest --dry-run          # show the plan\n"
      "  dstrain resume runs/tiny/checkpoints/latest --local --nproc 3  # re-shard onto 3 local "
      "ranks\n"
      "  dstrain resume runs/big/checkpoints/latest --hostfile hosts2   # other hosts\n"
      "See docs/checkpoints.md and docs/launch.md.");
  auto o = std::make_shared<train::ResumeOptions>();
  cmd->add_option("CKPT", o->checkpoint, "The checkpoint to resume")->required()->type_name("");
  add_where_flags(cmd, &o->request);
  add_launch_flags(cmd, &o->request);
  auto trace = std::make_shared<bool>(false);
  cmd->add_flag("--trace", *trace,
                "Record a Chrome/Perfetto trace per rank (same as --set logging.trace=true)");
  cmd->callback([o, trace, exit_code] {
    if (*trace) o->request.overrides.push_back("logging.trace=true");
    *exit_code = train::run_resume(*o);
  });
}

}  // namespace dstrain::app
