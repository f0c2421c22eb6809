// `dstrain ckpt verify CKPT` and `dstrain ckpt inspect CKPT [--config YAML]`: flags →
// lib/ckpt/inspect.h.

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/dstrain/command_info.h"
#include "apps/dstrain/commands.h"
#include "ckpt/inspect.h"

namespace dstrain::app {
namespace {

struct CkptArgs {
  std::string checkpoint;
  std::string config;
  std::vector<std::string> overrides;
};

void set_verify_command(CLI::App& ckpt, int* exit_code) {
  auto* cmd = ckpt.add_subcommand(
      "verify", "Check every file of a checkpoint against the sizes and crc32s of its manifest");
  cmd->footer(
      "Exit status 0 only when every file the manifest lists is present with its recorded size\n"
      "and checksum; 1 when any is not (each named with its problem); 2 when CKPT is not a\n"
      "complete checkpoint.\n"
      "Example:\n"
      "  dstrain ckpt verify runs/tiny/checkpoints/latest");
  auto a = std::make_shared<CkptArgs>();
  cmd->add_option("CKPT", a->checkpoint, "<dir>/latest, a directory holding latest, or a tag dir")
      ->required()
      ->type_name("");
  cmd->callback([a, exit_code] {
    const ckpt::VerifyReport r = ckpt::verify_checkpoint(a->checkpoint);
    for (const ckpt::FileCheck& f : r.files) {
      if (!f.ok()) std::printf("%s: %s\n", f.name.c_str(), f.problem().c_str());
    }
    std::printf("%s: %zu files, %s\n", r.tag_dir.c_str(), r.files.size(),
                r.ok() ? "every size and checksum verified" : "verification FAILED");
    *exit_code = r.ok() ? 0 : 1;
  });
}

void set_inspect_command(CLI::App& ckpt, int* exit_code) {
  auto* cmd = ckpt.add_subcommand(
      "inspect", "Step, world, stage, sizes and verified checksums of a checkpoint; config diff");
  cmd->footer(
      "With --config, also lists every setting of the checkpoint's saved config that differs\n"
      "from YAML (resolved as `dstrain train` would, with --set overrides).\n"
      "Example:\n"
      "  dstrain ckpt inspect runs/tiny/checkpoints/latest --config configs/tiny.yaml");
  auto a = std::make_shared<CkptArgs>();
  cmd->add_option("CKPT", a->checkpoint, "<dir>/latest, a directory holding latest, or a tag dir")
      ->required()
      ->type_name("");
  cmd->add_option("--config", a->config, "A run config to compare with")->type_name("YAML");
  cmd->add_option("--set", a->overrides, "Override for --config, key.path=value (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  cmd->callback([a, exit_code] {
    std::fputs(ckpt::inspect_report(a->checkpoint, a->config, a->overrides).c_str(), stdout);
    *exit_code = 0;
  });
}

}  // namespace

void set_ckpt_command(CLI::App& root, int* exit_code) {
  auto* cmd = add_worker_subcommand(root, kCkptCommand);
  cmd->footer(
      "Examples:\n"
      "  dstrain ckpt verify runs/tiny/checkpoints/latest\n"
      "  dstrain ckpt inspect runs/tiny/checkpoints/latest --config configs/tiny.yaml");
  cmd->require_subcommand(1);
  set_verify_command(*cmd, exit_code);
  set_inspect_command(*cmd, exit_code);
}

}  // namespace dstrain::app
