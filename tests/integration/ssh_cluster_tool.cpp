// ssh_cluster N: the test fixture's cluster of SSH hosts (ssh_cluster.h) as a stand-alone program,
// for scripts/bench/launch-scale, so the benchmark runs on exactly the hosts the tests use.
//
// Prints one JSON line describing the cluster on stdout once every sshd listens, then holds it
// until its stdin reaches end of file (the caller exits or closes the pipe) or SIGINT/SIGTERM/
// SIGHUP arrives, and removes everything (namespaces, their processes, bridge, keys). Exit code 0,
// 1 when the cluster cannot be built, 2 for a bad argument.

#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "tests/integration/ssh_cluster.h"

namespace {

std::string quoted(const std::string& s) {  // JSON string; the values here need no escapes
  return "\"" + s + "\"";
}

std::string describe(const dstrain::testing::SshCluster& c) {
  std::string hosts;
  for (int k = 0; k < c.size(); ++k) {
    hosts += std::string(k == 0 ? "" : ",") + "{\"address\":" + quoted(c.address(k)) +
             ",\"namespace\":" + quoted(c.namespace_name(k)) + ",\"veth\":" + quoted(c.veth(k)) +
             ",\"sshd_pid\":" + std::to_string(c.sshd_pid(k)) + "}";
  }
  return "{\"port\":" + std::to_string(c.port()) + ",\"dir\":" + quoted(c.dir()) +
         ",\"client_key\":" + quoted(c.client_key()) +
         ",\"known_hosts\":" + quoted(c.known_hosts()) +
         ",\"interface\":" + quoted(dstrain::testing::SshCluster::kInterface) + ",\"hosts\":[" +
         hosts + "]}";
}

void on_signal(int) {}  // only interrupts read(); the cluster is then removed normally

}  // namespace

int main(int argc, char** argv) {
  int hosts = argc == 2 ? std::atoi(argv[1]) : 0;
  if (hosts < 1 || hosts > 250) {
    std::fprintf(stderr, "usage: ssh_cluster HOSTS (1..250); runs until stdin closes\n");
    return 2;
  }
  std::string reason = dstrain::testing::SshCluster::skip_reason();
  if (!reason.empty()) {
    std::fprintf(stderr, "ssh_cluster: cannot build a cluster here: %s\n", reason.c_str());
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;  // no SA_RESTART: read() returns EINTR
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  try {
    dstrain::testing::SshCluster cluster(hosts);
    std::printf("%s\n", describe(cluster).c_str());
    std::fflush(stdout);
    char buf[256];
    while (::read(0, buf, sizeof(buf)) > 0) {
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ssh_cluster: %s\n", e.what());
    return 1;
  }
  return 0;
}
