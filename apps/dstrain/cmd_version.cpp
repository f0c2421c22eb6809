#include <cstdio>

#include "apps/dstrain/commands.h"
#include "apps/dstrain/version.h"

namespace dstrain::app {

void set_version_command(CLI::App& root, int* exit_code) {
  auto* cmd = root.add_subcommand("version", "Print the dstrain version and build features");
  cmd->footer(
      "The features say what this build can run on: cpu or cuda, and its communicators (gloo,\n"
      "nccl). 'dstrain launch --dry-run --check' runs it on every host.\n"
      "Example:\n"
      "  dstrain version");
  cmd->callback([exit_code] {
    std::printf("dstrain %s (%s)\n", kVersion, kBuildFeatures);
    *exit_code = 0;
  });
}

}  // namespace dstrain::app
