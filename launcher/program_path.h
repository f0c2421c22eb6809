#pragma once
// Finding the programs ranks run: dstrain-worker (beside this binary) for `dstrain train`, or a
// user program for --exec. Both are resolved to absolute paths before any fork, so a missing
// program is one clear error instead of N failing ranks, and the child only has to execve().

#include <string>

namespace dstrain::launcher {

// Absolute path of the running executable (/proc/self/exe). Throws Error(kIo).
std::string self_executable();

// The executable that runs dstrain's LibTorch commands (apps/dstrain/command_info.h). `dstrain`
// itself never loads LibTorch, so ranks start the worker directly, saving an exec.
constexpr const char* kWorkerName = "dstrain-worker";

// kWorkerName in this executable's directory, or this executable when it is the worker. Pure path
// arithmetic: does not check that the file exists. Throws Error(kIo) like self_executable().
std::string worker_executable();

// The `dstrain` that node agents run (over SSH and with srun): this executable, or when this is
// dstrain-worker (`dstrain resume` launches from the worker) the `dstrain` beside it if it is
// there, so an agent does not load LibTorch. Throws Error(kIo) like self_executable().
std::string launcher_executable();

// `name` itself when it contains a '/', else the first executable match on PATH (as execvp would).
// Throws Error(kUsage) when nothing executable is found, naming the program and PATH.
std::string resolve_program(const std::string& name);

}  // namespace dstrain::launcher
