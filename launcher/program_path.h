#pragma once
// Finding the programs ranks run: this very binary for `dstrain train`, or a user program for
// --exec. Both are resolved to absolute paths before any fork, so a missing program is one clear
// error instead of N failing ranks, and the child only has to execve().

#include <string>

namespace dstrain::launcher {

// Absolute path of the running executable (/proc/self/exe). Throws Error(kIo).
std::string self_executable();

// `name` itself when it contains a '/', else the first executable match on PATH (as execvp would).
// Throws Error(kUsage) when nothing executable is found, naming the program and PATH.
std::string resolve_program(const std::string& name);

}  // namespace dstrain::launcher
