#include <iostream>
#include <memory>

#include "apps/dstrain/command_info.h"
#include "apps/dstrain/commands.h"
#include "train/run_plan.h"

namespace dstrain::app {
namespace {

struct EstimateArgs {
  std::string config;
  int nodes = 1;
  int gpus = 1;
  std::vector<std::string> overrides;
  bool json = false;
};

}  // namespace

void set_estimate_command(CLI::App& root, int* exit_code) {
  auto* cmd = add_worker_subcommand(root, kEstimateCommand);
  cmd->footer(
      "Parameters, gradients, fp32 master weights and optimizer state per rank, on the device and\n"
      "in host memory, for the config's model (its config.json) on NODES x GPUS ranks.\n"
      "Example:\n"
      "  dstrain estimate configs/tiny.yaml --nodes 2 --gpus 8");
  auto a = std::make_shared<EstimateArgs>();
  cmd->add_option("CONFIG", a->config, "The run's YAML config")->required()->type_name("");
  cmd->add_option("--nodes", a->nodes, "Nodes")->check(CLI::PositiveNumber)->default_val(1);
  cmd->add_option("--gpus", a->gpus, "Ranks (GPUs) per node")
      ->check(CLI::PositiveNumber)
      ->default_val(1);
  cmd->add_option("--set", a->overrides, "Config override key.path=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->add_flag("--json", a->json, "Print JSON (bytes per rank) instead of the table");
  cmd->callback([a, exit_code] {
    std::cout << train::estimate_report(a->config, a->overrides, a->nodes * a->gpus, a->json);
    *exit_code = 0;
  });
}

}  // namespace dstrain::app
