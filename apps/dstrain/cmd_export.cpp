#include "apps/dstrain/commands.h"
#include "core/error.h"

namespace dstrain::app {

void set_export_command(CLI::App& root, int* exit_code) {
  auto* cmd = root.add_subcommand("export", "(not available yet in this build)");
  cmd->allow_extras();
  cmd->callback([exit_code] {
    fail(ErrorKind::kNotImplemented, "'dstrain export' is not available in this build yet");
    *exit_code = 3;
  });
}

}  // namespace dstrain::app
