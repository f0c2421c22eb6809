#include <memory>

#include "apps/dstrain/command_info.h"
#include "apps/dstrain/commands.h"
#include "train/train.h"

namespace dstrain::app {

void set_train_command(CLI::App& root, int* exit_code) {
  auto* cmd = add_worker_subcommand(root, kTrainCommand);
  cmd->footer(
      "The world comes from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (a single process when\n"
      "unset). SIGUSR1 saves a checkpoint within two steps and stops cleanly.\n"
      "Examples:\n"
      "  dstrain train configs/tiny.yaml --set training.max_steps=20\n"
      "  dstrain train --print-config run.yaml");
  auto o = std::make_shared<train::TrainOptions>();
  cmd->add_option("CONFIG", o->config_path, "The run's YAML config")->required()->type_name("");
  cmd->add_option("--set", o->overrides, "Config override key.path=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_flag("--print-config", o->print_config,
                "Print the fully resolved config (defaults filled in) as YAML and exit");
  auto trace = std::make_shared<bool>(false);
  cmd->add_flag("--trace", *trace,
                "Record a Chrome/Perfetto trace of this rank (same as --set logging.trace=true)");
  cmd->add_option("--resume-from", o->resume_from,
                  "Restore state from a checkpoint (<dir>/latest, <dir> or a tag directory)")
      ->type_name("CKPT");
  cmd->callback([o, trace, exit_code] {
    if (*trace) o->overrides.push_back("logging.trace=true");
    *exit_code = train::run_train(*o);
  });
}

}  // namespace dstrain::app
