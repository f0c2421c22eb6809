// check_slurm_nodes (launcher/slurm_step.h) against stand-ins for squeue, sinfo and srun on PATH:
// a probe is judged by its process's exit, not by its output closing (srun closes its output when
// the step's tasks end and exits after telling the controller, seconds later on a busy cluster),
// and a probe that outlives the timeout is named as such.
#include "launcher/slurm_step.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/common/temp_dir.h"

namespace dstrain::launcher {
namespace {

class SlurmNodeCheck : public ::testing::Test {
 protected:
  // squeue lists the job's nodes dn1,dn2; sinfo says both are allocated; srun runs `probe` (a shell
  // body that sees the node as $node).
  void commands(const std::string& probe) {
    script("squeue", "echo 'dn[1-2]'");
    script("sinfo", "echo 'dn1 alloc'; echo 'dn2 alloc'");
    script("srun", "for a; do prev=$node; node=$a; [ \"$prev\" = -w ] && break; done\n" + probe);
    const char* old = std::getenv("PATH");
    saved_path_ = old ? old : "";
    ::setenv("PATH", (bin_.path().string() + ":" + saved_path_).c_str(), 1);
  }
  void TearDown() override {
    if (!saved_path_.empty()) ::setenv("PATH", saved_path_.c_str(), 1);
  }
  void script(const std::string& name, const std::string& body) {
    const std::string path = (bin_ / name).string();
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    ::chmod(path.c_str(), 0755);
  }

  testing::TempDir bin_;
  std::string saved_path_;
};

TEST_F(SlurmNodeCheck, AProbeThatClosesItsOutputBeforeExitingIsWaitedFor) {
  // Both probes close their output at once and exit 1.5 s later, well within the timeout.
  commands("exec >/dev/null 2>&1; sleep 1.5; exit 0");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<NodeCheck> checks = check_slurm_nodes("7", {"dn1", "dn2"}, 20);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(checks.size(), 2u);
  for (const NodeCheck& c : checks) EXPECT_TRUE(c.usable) << c.node << ": " << c.why;
  EXPECT_GE(seconds, 1.4);
  EXPECT_LT(seconds, 15) << "the probes ended after 1.5 s";
}

TEST_F(SlurmNodeCheck, AProbeStillRunningAtTheTimeoutIsNamedAndTheOthersAreNot) {
  // dn2's probe never ends; dn1's says its output and exits 0.
  commands("[ \"$node\" = dn2 ] && exec sleep 60; echo probe on $node; exit 0");
  const auto start = std::chrono::steady_clock::now();
  const std::vector<NodeCheck> checks = check_slurm_nodes("7", {"dn1", "dn2"}, 1.5);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(checks.size(), 2u);
  EXPECT_TRUE(checks[0].usable) << checks[0].why;
  EXPECT_FALSE(checks[1].usable);
  EXPECT_EQ(checks[1].why, "a probe step (srun -w dn2 true) did not end within 1.5 s");
  EXPECT_LT(seconds, 10) << "the hung probe is killed at the timeout";
}

TEST_F(SlurmNodeCheck, AFailedProbeSaysWhatItPrinted) {
  commands(
      "[ \"$node\" = dn1 ] && { echo 'srun: error: Unable to create step' >&2; exit 1; }; "
      "exit 0");
  const std::vector<NodeCheck> checks = check_slurm_nodes("7", {"dn1", "dn2"}, 20);
  ASSERT_EQ(checks.size(), 2u);
  EXPECT_FALSE(checks[0].usable);
  EXPECT_EQ(checks[0].why,
            "a probe step (srun -w dn1 true) failed: srun: error: Unable to create step");
  EXPECT_TRUE(checks[1].usable) << checks[1].why;
}

}  // namespace
}  // namespace dstrain::launcher
