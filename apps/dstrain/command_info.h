#pragma once
// Which executable runs which command. `dstrain` (main.cpp) links no LibTorch: it runs `launch`
// (local launcher, SSH launcher, node agent), `report`, `trace` and `version` itself, and hands
// every other command to `dstrain-worker` (worker_main.cpp, installed beside it) by exec'ing it
// with the same arguments. Loading LibTorch costs ~0.4 s of CPU, ~500 MB and 68 shared libraries
// per process (read from wherever the environment lives, often an NFS home), which a launcher, a
// node agent on each of 64 hosts, or `dstrain --help` should not pay.
//
// The worker commands' names and one-line descriptions live here, and both executables register
// them through add_worker_subcommand(), so `dstrain --help` lists them without loading the worker
// and says exactly what the worker's own help says.

#include <string_view>

#include <CLI/CLI.hpp>

namespace dstrain::app {

struct CommandInfo {
  const char* name;
  const char* description;
  bool hidden;  // not listed by --help (an empty CLI11 group)
};

inline constexpr CommandInfo kTrainCommand{
    "train", "Run one rank of a training job (started by 'dstrain launch', or alone)", false};
inline constexpr CommandInfo kResumeCommand{
    "resume", "Relaunch a run from a checkpoint with its saved config and state", false};
inline constexpr CommandInfo kExportCommand{
    "export", "Consolidate a checkpoint into a Hugging Face model directory (safetensors)", false};
inline constexpr CommandInfo kEstimateCommand{
    "estimate", "Per-rank memory of model states for each ZeRO stage, with and without offload",
    false};
inline constexpr CommandInfo kDownloadCommand{
    "download", "Download a model from the Hugging Face Hub into the Hugging Face cache", false};
inline constexpr CommandInfo kDataCommand{"data", "Data preparation tools", false};
inline constexpr CommandInfo kCkptCommand{"ckpt", "Inspect and verify checkpoints", false};
// Hidden; documented in docs/gpu.md.
inline constexpr CommandInfo kDebugCommand{"debug", "Checking tools (reference comparisons)", true};

// In the order `dstrain --help` lists them (between `launch` and `version`).
inline constexpr CommandInfo kWorkerCommands[] = {
    kTrainCommand,    kResumeCommand, kExportCommand, kEstimateCommand,
    kDownloadCommand, kDataCommand,   kCkptCommand,   kDebugCommand};

inline CLI::App* add_worker_subcommand(CLI::App& root, const CommandInfo& info) {
  CLI::App* cmd = root.add_subcommand(info.name, info.description);
  if (info.hidden) cmd->group("");
  return cmd;
}

// True when `dstrain <arg> ...` is run by the worker: a worker command, or --help-all (only the
// worker knows every command's options).
inline bool runs_in_worker(std::string_view arg) {
  if (arg == "--help-all") return true;
  for (const CommandInfo& info : kWorkerCommands) {
    if (arg == info.name) return true;
  }
  return false;
}

// dstrain's side. exec_worker replaces this process with dstrain-worker running `argv` (argv[0]
// is overwritten); it returns only when that fails, with the exit code, after saying why.
int exec_worker(char** argv);

// Registers every worker command on `dstrain`'s root, for --help, each handing `argv` to the worker
// should CLI11 select it (main() normally does that before parsing; see runs_in_worker).
void set_worker_commands(CLI::App& root, char** argv, int* exit_code);

}  // namespace dstrain::app
