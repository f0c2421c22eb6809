#pragma once
// One SSH connection (libssh) running one remote command, for the multi-node launcher.
//
// Contract:
//  - The constructor connects (bounded by connect_timeout), verifies the server's host key against
//    known_hosts — strictly: an unknown key is an error unless accept_new_host_keys (then it is
//    added), a changed key is always an error — and authenticates with a public key: only
//    `key_file` when given, else ssh-agent and ~/.ssh/id_*. ~/.ssh/config is honoured (Host
//    aliases, User, Port, IdentityFile) unless overridden by the target. Every failure is
//    Error(kComm) whose message names user@host:port and what to do.
//  - Dead connections are noticed by the kernel too: TCP keepalive probes after keepalive_seconds
//    / 3 of silence and TCP_USER_TIMEOUT = keepalive_seconds, so a socket whose data stays
//    unacknowledged that long fails. (A silent link with nothing to send is the caller's to notice:
//    ssh_job's keepalive lines, node_agent.h.)
//  - An SshSession is used by one thread at a time (libssh sessions are not thread-safe); distinct
//    sessions may live in distinct threads.

#include <memory>
#include <string>

namespace dstrain::launcher {

struct SshTarget {
  std::string host;
  std::string user;  // "" = ~/.ssh/config or the local user
  int port = 0;      // 0 = ~/.ssh/config or 22
};

struct SshSettings {
  std::string key_file;     // private key; "" = ssh-agent and ~/.ssh/id_*
  std::string known_hosts;  // "" = ~/.ssh/known_hosts (and /etc/ssh/ssh_known_hosts)
  bool accept_new_host_keys = false;
  double connect_timeout = 10;
  double keepalive_seconds = 10;  // --ssh-keepalive
};

// "user@host:port" as far as known, for messages.
std::string describe_target(const SshTarget& target);

class SshSession {
 public:
  SshSession(const SshTarget& target, const SshSettings& settings);
  ~SshSession();
  SshSession(const SshSession&) = delete;
  SshSession& operator=(const SshSession&) = delete;

  // Starts `command` on a new session channel (no pty; stdin stays open until send_eof()).
  void exec(const std::string& command);

  // Waits up to timeout_ms for output, appends what arrived. Returns false once the channel is
  // closed or at end of file on both streams. Throws Error(kComm) when the connection fails.
  bool read(std::string* out, std::string* err, int timeout_ms);

  void send_eof();                            // the remote command sees end of file on stdin
  void write_stdin(const std::string& data);  // to the remote command's stdin; best effort
  int exit_status();  // the command's exit code; -1 if none was sent (signal)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dstrain::launcher
