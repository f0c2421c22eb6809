#pragma once
// Shell commands for the cluster fixtures (ssh_cluster, slurm_cluster): they set up networks and
// daemons with the system's own tools (ip, sshd, munged, slurmctld), so they run command lines and
// read what those print.

#include <string>
#include <vector>

namespace dstrain::testing {

// Runs `command` with /bin/sh and returns its stdout (stderr goes where the command sends it); ""
// when the shell cannot be started.
std::string shell_output(const std::string& command);

// Runs `command` with /bin/sh, its output discarded. A non-zero status records a test failure
// naming the command and throws std::runtime_error(`what`), for a fixture's constructor to clean up
// and rethrow.
void shell_must(const std::string& command, const std::string& what);

// The non-empty lines of `text`.
std::vector<std::string> lines_of(const std::string& text);

// A fresh directory <temp>/<prefix>XXXXXX (mkdtemp) that the caller removes; throws
// std::runtime_error when it cannot be made.
std::string make_temp_dir(const std::string& prefix);

}  // namespace dstrain::testing
