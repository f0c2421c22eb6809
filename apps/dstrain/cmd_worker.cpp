#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "apps/dstrain/command_info.h"
#include "core/error.h"
#include "launcher/program_path.h"

namespace dstrain::app {

int exec_worker(char** argv) {
  std::string worker;
  try {
    worker = launcher::worker_executable();
  } catch (const Error& e) {
    std::fprintf(stderr, "dstrain: %s: %s\n", to_string(e.kind()), e.what());
    return exit_code(e.kind());
  }
  argv[0] = worker.data();  // so `ps` shows which executable runs
  ::execv(worker.c_str(), argv);
  std::fprintf(stderr,
               "dstrain: %s: cannot run %s: %s ('dstrain %s' runs in %s, which is installed beside "
               "dstrain)\n",
               to_string(ErrorKind::kIo), worker.c_str(), std::strerror(errno), argv[1],
               launcher::kWorkerName);
  return exit_code(ErrorKind::kIo);
}

void set_worker_commands(CLI::App& root, char** argv, int* exit_code) {
  for (const CommandInfo& info : kWorkerCommands) {
    CLI::App* cmd = add_worker_subcommand(root, info);
    // main() hands these to the worker before parsing; should CLI11 still pick one, the worker
    // gets the untouched argv all the same, --help included.
    cmd->set_help_flag();
    cmd->prefix_command();
    cmd->callback([argv, exit_code] { *exit_code = exec_worker(argv); });
  }
}

}  // namespace dstrain::app
