#pragma once
// The gtest fixture of the multi-node tests: a cluster of SSH hosts (ssh_cluster.h), a hostfile
// with `slots` per host, and a token for DSTRAIN_TEST_MARKER, which every process of a job carries;
// TearDown kills whatever of the job is left, then removes the cluster. Skips the test where the
// cluster cannot be made (not root, no `ip netns`, no sshd).

#include <signal.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/integration/ssh_cluster.h"

namespace dstrain::testing {

class SshFixture : public ::testing::Test {
 protected:
  explicit SshFixture(int hosts, int slots = 2, std::string login_rc = "")
      : hosts_(hosts), slots_(slots), login_rc_(std::move(login_rc)) {}

  void SetUp() override {
    const std::string reason = SshCluster::skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    cluster_ = std::make_unique<SshCluster>(hosts_, login_rc_);
    hostfile_ = tmp_.file("hosts");
    std::ofstream(hostfile_) << "# test cluster\n" << cluster_->hostfile(slots_);
    token_ = unique_token();
  }

  void TearDown() override {
    if (!token_.empty()) {
      for (pid_t pid : processes_with_marker(token_)) ::kill(pid, SIGKILL);
    }
    cluster_.reset();
  }

  // `launch --hostfile H --ssh-key K --ssh-known-hosts F --grace 2`, then `extra`.
  std::vector<std::string> launch_args(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> a = {"launch",
                                  "--hostfile",
                                  hostfile_,
                                  "--ssh-key",
                                  cluster_->client_key(),
                                  "--ssh-known-hosts",
                                  cluster_->known_hosts(),
                                  "--grace",
                                  "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  std::string host(int k) const { return cluster_->address(k); }

  TempDir tmp_;
  std::unique_ptr<SshCluster> cluster_;
  std::string hostfile_;
  std::string token_;

 private:
  int hosts_;
  int slots_;
  std::string login_rc_;
};

}  // namespace dstrain::testing
