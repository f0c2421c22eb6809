#include <memory>

#include "apps/dstrain/command_info.h"
#include "apps/dstrain/commands.h"
#include "train/train.h"

namespace dstrain::app {

void set_resume_command(CLI::App& root, int* exit_code) {
  auto* cmd = add_worker_subcommand(root, kResumeCommand);
  cmd->footer(
      "CKPT is <dir>/latest, a checkpoint directory holding 'latest', or a tag directory.\n"
      "Data paths in the saved config are relative to the directory the run was started from.\n"
      "Examples:\n"
      "  dstrain resume runs/tiny/checkpoints/latest\n"
      "  dstrain resume runs/tiny/checkpoints/latest --nproc 3   # re-shard onto 3 ranks");
  auto o = std::make_shared<train::ResumeOptions>();
  o->launch.nproc = 0;
  cmd->add_option("CKPT", o->checkpoint, "The checkpoint to resume")->required()->type_name("");
  cmd->add_option("--nproc", o->launch.nproc,
                  "Number of local ranks [default: the checkpoint's world size]")
      ->type_name("N");
  cmd->add_option("--set", o->launch.overrides, "Config override key.path=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_option("--master-addr", o->launch.master_addr, "MASTER_ADDR given to every rank")
      ->type_name("ADDR");
  cmd->add_option("--master-port", o->launch.master_port,
                  "MASTER_PORT given to every rank [default: a free port]")
      ->type_name("PORT");
  cmd->add_option("--log-dir", o->launch.log_dir, "Also write each rank's output to DIR/rank_K.log")
      ->type_name("DIR");
  cmd->add_option("--max-restarts", o->launch.restart.max_restarts,
                  "Restart a failed job from the newest checkpoint, at most N times in a row "
                  "without a new checkpoint")
      ->type_name("N");
  cmd->add_option("--restart-backoff", o->launch.restart.backoff_seconds,
                  "Seconds to wait before a restart")
      ->type_name("SECONDS");
  cmd->add_flag("--dry-run", o->launch.dry_run, "Print the plan, start nothing");
  auto trace = std::make_shared<bool>(false);
  cmd->add_flag("--trace", *trace,
                "Record a Chrome/Perfetto trace per rank (same as --set logging.trace=true)");
  cmd->callback([o, trace, exit_code] {
    if (o->launch.nproc < 0) o->launch.nproc = 0;
    if (*trace) o->launch.overrides.push_back("logging.trace=true");
    *exit_code = train::run_resume(*o);
  });
}

}  // namespace dstrain::app
