#pragma once
// A throwaway cluster of SSH hosts on this machine, for multi-node tests: N network namespaces
// joined by a bridge in the root namespace (one private /24 under 10.77.0.0/16, chosen per test
// process and checked unused), each running its own OpenSSH server (/usr/sbin/sshd -D with a
// generated config and host key) that accepts a generated client key. The launcher, in the root
// namespace, reaches host k at address(k):port(); hosts reach each other over the bridge, so rank
// 0's rendezvous port on host 0 is reachable from every host (what a real training job needs).
//
// Namespaces share the filesystem and the process table with the root namespace, like hosts with a
// shared NFS home: the same dstrain binary and working directory exist "remotely". Each sshd sees
// ~/.bashrc as an empty file (a bind mount in its own mount namespace): the build machine's rc file
// would otherwise run in every SSH command (root's here runs `pyenv init`, ~0.4 s a login).
//
// Node-local disks: local_dir() is one path that each host sees as its own directory (a bind mount
// in its sshd's mount namespace of host_local_dir(k), which the root namespace sees as is), the way
// /local/scratch differs from machine to machine while the shared file system does not.
//
// Everything is removed by the destructor (and stale leftovers of killed test processes at the
// next start). Tests must call SshCluster::skip_reason() first and GTEST_SKIP when it is not
// empty (not root, no `ip netns`, no sshd).

#include <string>
#include <vector>

namespace dstrain::testing {

class SshCluster {
 public:
  // The network interface of every host (the same name in each namespace), e.g. for
  // GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME.
  static constexpr const char* kInterface = "dseth0";

  static std::string skip_reason();

  // Aborts the test (ADD_FAILURE + throw) if setup fails. `login_rc`: shell code the login shell
  // (bash) of every SSH command runs before the command, in place of ~/.bashrc (which must exist),
  // e.g. "sleep 0.5" for a slow login, during which the command is the shell's argv, as on a node
  // whose rc files take time.
  explicit SshCluster(int hosts, const std::string& login_rc = "");
  ~SshCluster();
  SshCluster(const SshCluster&) = delete;
  SshCluster& operator=(const SshCluster&) = delete;

  int size() const { return static_cast<int>(namespaces_.size()); }
  std::string address(int k) const;    // "10.77.S.(k+2)"
  std::string unused_address() const;  // in the subnet, nobody answers
  int port() const { return port_; }
  const std::string& namespace_name(int k) const { return namespaces_[k]; }
  // Host k's end of its link in the root namespace: `ip link set <veth> down` cuts host k off.
  const std::string& veth(int k) const { return veths_[k]; }
  int sshd_pid(int k) const;  // host k's listening sshd (its pid file)
  // The live processes on host k (in its network namespace), its listening sshd excepted: what a
  // job left behind there, SSH sessions included.
  std::vector<int> processes_on(int k) const;
  std::string dir() const { return dir_; }
  std::string client_key() const { return dir_ + "/client_key"; }
  std::string wrong_key() const { return dir_ + "/wrong_key"; }
  std::string known_hosts() const { return dir_ + "/known_hosts"; }
  std::string local_dir() const { return dir_ + "/local"; }  // on a host: its node-local disk
  std::string host_local_dir(int k) const { return dir_ + "/local_" + std::to_string(k); }
  // "addr:port slots=N" lines for hosts 0..size()-1.
  std::string hostfile(int slots) const;

 private:
  void create_network();
  void start_sshd(int k, const std::string& login_rc);
  void write_keys();
  void cleanup();

  std::string dir_;
  std::string tag_;  // unique per process: names of namespaces, bridge, veths
  int subnet_ = 0;   // third octet
  int port_ = 22022;
  std::string bridge_;
  std::vector<std::string> namespaces_;
  std::vector<std::string> veths_;
};

// The name of the network namespace process `pid` runs in ("" for the root namespace / unknown).
std::string netns_of(int pid);

// The value of variable `name` in /proc/<pid>/environ ("" if absent).
std::string environ_value(int pid, const std::string& name);

// /proc/<pid>/comm without the newline.
std::string comm_of(int pid);

}  // namespace dstrain::testing
