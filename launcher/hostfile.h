#pragma once
// Hostfiles (DeepSpeed syntax, extended): one host per line, `#` starts a comment, blank lines are
// skipped, and host order fixes rank order.
//
//   [user@]host[:port] slots=N [ssh_port=P]
//
// `host:port` and `ssh_port=P` both set the SSH port (giving both, with different values, is an
// error). Every problem — an unknown key, a missing or non-positive `slots`, a duplicate host, an
// empty file — is Error(kInput) naming the file and line.

#include <string>
#include <vector>

namespace dstrain::launcher {

struct HostEntry {
  std::string host;  // name or address as written (without user@ and :port)
  std::string user;  // "" = the SSH default (the local user)
  int ssh_port = 0;  // 0 = the SSH default (22)
  int slots = 0;     // >= 1: devices (GPUs) on the host, one rank each
  int line = 0;      // 1-based line in the hostfile, for messages
};

// Parses hostfile text; `path` is only used in messages.
std::vector<HostEntry> parse_hostfile(const std::string& text, const std::string& path);

// Reads and parses a hostfile; Error(kInput) when it cannot be read.
std::vector<HostEntry> read_hostfile(const std::string& path);

}  // namespace dstrain::launcher
