#pragma once
// Variables that must never appear on a command line — the secrets of core/secrets.h — reach a
// node agent over SSH on its stdin, the channel itself, instead of in the remote command (which
// every user of the host can read in `ps` while it runs). The root writes encode_stdin_env() right
// after starting the agent with --env-on-stdin; the agent reads the block with read_stdin_env()
// before anything else, before its control lines (node_agent.h), puts the variables into its own
// environment, which its ranks inherit, and redacts their values from everything it prints.
//
// Format: one line "dstrain-agent-env NAME HEX" per variable (the value hex-encoded, so any byte
// but NUL passes), then the line "dstrain-agent-env-end"; an empty block is that line alone.

#include <string>

#include "launcher/plan.h"

namespace dstrain::launcher {

constexpr const char* kStdinEnvLine = "dstrain-agent-env";
constexpr const char* kStdinEnvEndLine = "dstrain-agent-env-end";

std::string encode_stdin_env(const EnvList& env);

// Reads the block from `fd` one byte at a time, so nothing after the end line is consumed (the
// control lines stay for the stdin watcher). Error(kComm) when the stream ends or timeout_seconds
// pass before the end line; Error(kUsage) for a line that is not part of the format.
EnvList read_stdin_env(int fd, double timeout_seconds);

// read_stdin_env() on stdin, then each variable set in this process's environment and learnt as a
// secret (core/secrets.h).
void adopt_stdin_env(double timeout_seconds);

}  // namespace dstrain::launcher
