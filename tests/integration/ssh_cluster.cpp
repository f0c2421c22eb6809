#include "tests/integration/ssh_cluster.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/integration/shell_util.h"

namespace dstrain::testing {
namespace {

namespace fs = std::filesystem;

void must(const std::string& command) {
  shell_must(command, "ssh cluster setup failed");
}

// Kills every process inside network namespace `ns` (all of them were started by this fixture or
// by the job under test there), then deletes it.
void remove_namespace(const std::string& ns) {
  for (int round = 0; round < 20; ++round) {
    std::vector<std::string> pids = lines_of(shell_output("ip netns pids " + ns + " 2>/dev/null"));
    if (pids.empty()) break;
    for (const std::string& pid : pids) ::kill(std::atoi(pid.c_str()), SIGKILL);
    ::usleep(50 * 1000);
  }
  std::system(("ip netns del " + ns + " >/dev/null 2>&1").c_str());
}

// Namespaces and bridges left by a test process that no longer exists (killed by a timeout).
void remove_stale_leftovers() {
  for (const std::string& ns : lines_of(shell_output("ip netns list 2>/dev/null"))) {
    std::string name = ns.substr(0, ns.find(' '));
    if (name.rfind("dstrain_t", 0) != 0) continue;
    int pid = std::atoi(name.substr(9).c_str());
    if (pid > 0 && ::kill(pid, 0) != 0) remove_namespace(name);
  }
  for (const std::string& line :
       lines_of(shell_output("ip -o link show type bridge 2>/dev/null"))) {
    size_t at = line.find("dsb");
    if (at == std::string::npos) continue;
    std::string name = line.substr(at, line.find(':', at) - at);
    int pid = std::atoi(name.substr(3).c_str());
    if (pid > 0 && ::kill(pid, 0) != 0)
      std::system(("ip link del " + name + " 2>/dev/null").c_str());
  }
}

bool subnet_in_use(int subnet) {
  std::string needle = "10.77." + std::to_string(subnet) + ".";
  return shell_output("ip -4 -o addr show 2>/dev/null").find(needle) != std::string::npos;
}

}  // namespace

std::string SshCluster::skip_reason() {
  if (::geteuid() != 0) return "needs root (network namespaces, sshd)";
  if (::access("/usr/sbin/sshd", X_OK) != 0)
    return "needs /usr/sbin/sshd (apt-get install openssh-server)";
  if (::access("/usr/bin/ssh-keygen", X_OK) != 0) return "needs ssh-keygen (openssh-client)";
  if (std::system("ip netns list >/dev/null 2>&1") != 0)
    return "'ip netns' is unavailable (iproute2)";
  return "";
}

SshCluster::SshCluster(int hosts, const std::string& login_rc) {
  remove_stale_leftovers();
  dir_ = make_temp_dir("dstrain_ssh_");
  ::chmod(dir_.c_str(), 0755);
  tag_ = std::to_string(::getpid());
  bridge_ = "dsb" + tag_;
  subnet_ = 100 + ::getpid() % 150;
  while (subnet_in_use(subnet_)) subnet_ = 100 + (subnet_ - 99) % 150;
  port_ = 22022 + ::getpid() % 1000;
  for (int k = 0; k < hosts; ++k) {
    namespaces_.push_back("dstrain_t" + tag_ + "_" + std::to_string(k));
    veths_.push_back("dsv" + tag_ + "_" + std::to_string(k));
  }
  try {
    write_keys();
    create_network();
    if (!login_rc.empty()) std::ofstream(dir_ + "/login_rc") << login_rc << "\n";
    for (int k = 0; k < hosts; ++k) start_sshd(k, login_rc);
  } catch (...) {
    cleanup();
    throw;
  }
}

SshCluster::~SshCluster() {
  cleanup();
}

void SshCluster::cleanup() {
  for (const std::string& ns : namespaces_) remove_namespace(ns);
  namespaces_.clear();
  // A namespace is destroyed asynchronously (later still while sockets of a cut-off link linger),
  // and its veth pair with it; deleting our end now frees the names for the next cluster.
  for (const std::string& veth : veths_)
    std::system(("ip link del " + veth + " 2>/dev/null").c_str());
  veths_.clear();
  if (!bridge_.empty()) std::system(("ip link del " + bridge_ + " >/dev/null 2>&1").c_str());
  bridge_.clear();
  std::error_code ignored;
  if (!dir_.empty()) fs::remove_all(dir_, ignored);
  dir_.clear();
}

std::string SshCluster::address(int k) const {
  return "10.77." + std::to_string(subnet_) + "." + std::to_string(k + 2);
}

int SshCluster::sshd_pid(int k) const {
  return std::atoi(read_text(dir_ + "/sshd_" + std::to_string(k) + ".pid").c_str());
}

std::vector<int> SshCluster::processes_on(int k) const {
  struct stat ns {};
  std::vector<int> found;
  if (::stat(("/run/netns/" + namespaces_[k]).c_str(), &ns) != 0) return found;
  int listener = sshd_pid(k);
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = ::readdir(proc)) {
    int pid = std::atoi(entry->d_name);
    struct stat st {};
    if (pid <= 0 || pid == listener) continue;
    if (::stat(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), &st) != 0) continue;
    if (st.st_ino == ns.st_ino && is_alive(pid)) found.push_back(pid);
  }
  ::closedir(proc);
  return found;
}

std::string SshCluster::unused_address() const {
  return "10.77." + std::to_string(subnet_) + ".250";
}

std::string SshCluster::hostfile(int slots) const {
  std::string out;
  for (int k = 0; k < size(); ++k) {
    out += address(k) + ":" + std::to_string(port_) + " slots=" + std::to_string(slots) + "\n";
  }
  return out;
}

void SshCluster::write_keys() {
  for (const char* key : {"client_key", "wrong_key"}) {
    must("ssh-keygen -q -t ed25519 -N '' -C dstrain-test -f " + dir_ + "/" + key);
  }
  fs::copy_file(dir_ + "/client_key.pub", dir_ + "/authorized_keys");
  ::chmod((dir_ + "/authorized_keys").c_str(), 0600);
  std::ofstream known(known_hosts());
  for (int k = 0; k < size(); ++k) {
    std::string key = dir_ + "/host_key_" + std::to_string(k);
    must("ssh-keygen -q -t ed25519 -N '' -C host -f " + key);
    std::string pub = read_text(key + ".pub");
    known << "[" << address(k) << "]:" << port_ << " " << pub;
  }
}

void SshCluster::create_network() {
  must("ip link add " + bridge_ + " type bridge");
  must("ip addr add 10.77." + std::to_string(subnet_) + ".1/24 dev " + bridge_);
  must("ip link set " + bridge_ + " up");
  for (int k = 0; k < size(); ++k) {
    const std::string& ns = namespaces_[k];
    std::string peer = "dsp" + tag_ + "_" + std::to_string(k);
    must("ip netns add " + ns);
    must("ip link add " + veths_[k] + " type veth peer name " + peer);
    must("ip link set " + peer + " netns " + ns);
    must("ip link set " + veths_[k] + " master " + bridge_);
    must("ip link set " + veths_[k] + " up");
    must("ip -n " + ns + " link set " + peer + " name " + kInterface);
    must("ip -n " + ns + " addr add " + address(k) + "/24 dev " + kInterface);
    must("ip -n " + ns + " link set " + kInterface + " up");
    must("ip -n " + ns + " link set lo up");
  }
}

void SshCluster::start_sshd(int k, const std::string& login_rc) {
  std::string n = std::to_string(k);
  std::string config = dir_ + "/sshd_config_" + n;
  const char* home = std::getenv("HOME");
  const std::string bashrc = std::string(home != nullptr ? home : "/root") + "/.bashrc";
  // A home without ~/.bashrc has nothing to bind `login_rc` over (below): sshd hands it to bash
  // as BASH_ENV instead, which the non-interactive bash of an SSH command reads.
  const std::string bash_env =
      !login_rc.empty() && !file_exists(bashrc) ? "SetEnv BASH_ENV=" + dir_ + "/login_rc\n" : "";
  std::ofstream(config) << bash_env << "ListenAddress " << address(k) << ":" << port_ << "\n"
                        << "HostKey " << dir_ << "/host_key_" << n << "\n"
                        << "AuthorizedKeysFile " << dir_ << "/authorized_keys\n"
                        << "PidFile " << dir_ << "/sshd_" << n << ".pid\n"
                        << "PermitRootLogin prohibit-password\n"
                        << "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                        << "UsePAM no\nStrictModes no\nLogLevel ERROR\nMaxStartups 100\n"
                        << "MaxSessions 100\nAcceptEnv none\nPermitUserEnvironment no\n";
  fs::create_directories("/run/sshd");  // sshd's privilege separation directory
  must("ip netns exec " + namespaces_[k] + " /usr/sbin/sshd -t -f " + config);
  std::string log = dir_ + "/sshd_" + n + ".log";
  // `ip netns exec` gives sshd its own mount namespace too; in it, this machine's ~/.bashrc (which
  // bash sources for every SSH command) is masked, so each host starts as a fresh machine would
  // and a login costs what sshd and the shell cost, not what the build machine's rc file does.
  std::string mask;
  // With `login_rc` that file takes the rc file's place instead (bash run by sshd reads ~/.bashrc;
  // without one, sshd's BASH_ENV above).
  const std::string rc = login_rc.empty() ? "/dev/null" : dir_ + "/login_rc";
  if (file_exists(bashrc)) mask = "mount --bind " + rc + " " + bashrc + " && ";
  fs::create_directories(local_dir());
  fs::create_directories(host_local_dir(k));
  mask += "mount --bind " + host_local_dir(k) + " " + local_dir() + " && ";
  must("ip netns exec " + namespaces_[k] + " sh -c '" + mask + "exec /usr/sbin/sshd -f " + config +
       " -E " + log + "'");
  // Daemonized sshd writes its pid file once it listens.
  bool up = wait_until([&] { return file_exists(dir_ + "/sshd_" + n + ".pid"); }, 10);
  if (!up) {
    ADD_FAILURE() << "sshd " << k << " did not start: " << read_text(log);
    throw std::runtime_error("sshd did not start");
  }
}

std::string netns_of(int pid) {
  return [&] {
    std::string out = shell_output("ip netns identify " + std::to_string(pid) + " 2>/dev/null");
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
  }();
}

std::string environ_value(int pid, const std::string& name) {
  std::string text = read_text("/proc/" + std::to_string(pid) + "/environ");
  std::string needle = name + "=";
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\0', pos);
    if (end == std::string::npos) end = text.size();
    if (text.compare(pos, needle.size(), needle) == 0)
      return text.substr(pos + needle.size(), end - pos - needle.size());
    pos = end + 1;
  }
  return "";
}

std::string comm_of(int pid) {
  std::string text = read_text("/proc/" + std::to_string(pid) + "/comm");
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

}  // namespace dstrain::testing
