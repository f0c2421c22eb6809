#include <cstdio>

#include "apps/dstrain/commands.h"
#include "apps/dstrain/version.h"

namespace dstrain::app {

void set_version_command(CLI::App& root, int* exit_code) {
  auto* cmd = root.add_subcommand("version", "Print the dstrain version and build features");
  cmd->callback([exit_code] {
    std::printf("dstrain %s (%s)\n", kVersion, kBuildFeatures);
    *exit_code = 0;
  });
}

}  // namespace dstrain::app
