#include "apps/dstrain/commands.h"
#include "core/error.h"

namespace dstrain::app {

void set_estimate_command(CLI::App& root, int* exit_code) {
  auto* cmd = root.add_subcommand(
      "estimate", "Per-rank memory for each ZeRO stage and offload (not available yet)");
  cmd->allow_extras();
  cmd->callback([] {
    fail(ErrorKind::kNotImplemented,
         "'dstrain estimate' is not available in this build yet (it comes with ZeRO-3 and "
         "offload)");
  });
  (void)exit_code;
}

}  // namespace dstrain::app
