// docs/quickstart-gpu.md's commands over SSH, as the page has them, on the CPU: two SSH hosts in
// network namespaces (ssh_cluster.h) stand in for node1 and node2. What must differ here, and
// nothing else: the model is the built-in tiny one (no hub: `--set model.name_or_path=...`, random
// init, byte tokenizer) where the page downloads Qwen2.5-0.5B; data/train.txt is the first 520
// lines of the demo corpus (about 5 steps) where the page downloads a text with curl; the hosts
// have 2 slots each where the page's have 8, and the launches name the test cluster's SSH key,
// known_hosts and interface; `export DSTRAIN_DEVICE=cuda` and nvidia-smi need a GPU. The config
// and the hostfile are the page's own (`cat > ... <<'EOF'` blocks), read from the page.
//
// Run in order: `dstrain version`; `launch --hostfile hosts --dry-run --check qwen-lora.yaml`;
// `launch --hostfile hosts qwen-lora.yaml` (done line, adapter, checkpoints every 2 steps);
// `resume runs/qwen-lora/checkpoints/latest --dry-run` and without --dry-run; `export
// runs/qwen-lora/checkpoints/latest --merge-lora --out DIR`.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/ssh_cluster.h"
#include "tests/integration/ssh_fixture.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

namespace stdfs = std::filesystem;

class QuickStartGpu : public SshFixture {
 protected:
  QuickStartGpu() : SshFixture(2) {}

  void SetUp() override {
    SshFixture::SetUp();
    if (IsSkipped()) return;
    // Paths in the page are relative to the directory the commands run in, on every node.
    previous_ = stdfs::current_path();
    stdfs::current_path(tmp_.path());
  }
  void TearDown() override {
    if (!previous_.empty()) stdfs::current_path(previous_);
    SshFixture::TearDown();
  }

  // The page's `dstrain launch --hostfile hosts ...` with the test cluster's SSH settings.
  std::vector<std::string> launch(std::vector<std::string> page_args) const {
    std::vector<std::string> a = {"launch",
                                  "--hostfile",
                                  "hosts",
                                  "--ssh-key",
                                  cluster_->client_key(),
                                  "--ssh-known-hosts",
                                  cluster_->known_hosts(),
                                  "--env",
                                  std::string("GLOO_SOCKET_IFNAME=") + SshCluster::kInterface};
    a.insert(a.end(), page_args.begin(), page_args.end());
    return a;
  }

  static std::vector<std::string> tiny_model() {
    return {"--set", "model.name_or_path=" DSTRAIN_SOURCE_DIR "/configs/models/tiny",
            "--set", "model.init=random",
            "--set", "model.tokenizer=byte"};
  }

  std::vector<std::string> env() const {
    return {"DSTRAIN_TEST_MARKER=" + token_, "SSH_AUTH_SOCK="};
  }

  stdfs::path previous_;
};

TEST_F(QuickStartGpu, EveryCommandOfThePageRunsOverSsh) {
  // The page's files: the config as it is; the hostfile with the cluster's hosts, 2 slots each.
  const std::string config = quick_start_block("qwen-lora.yaml");
  ASSERT_NE(config, "") << "docs/quickstart-gpu.md has no qwen-lora.yaml block";
  std::ofstream("qwen-lora.yaml") << config;
  std::string hosts = quick_start_block("hosts");
  ASSERT_EQ(hosts, "node1 slots=8\nnode2 slots=8\n");
  std::ofstream("hosts") << cluster_->hostfile(2);  // the two hosts (their sshd's port), 2 slots
  write_quick_start_data(tmp_.path());

  const RunResult version = run_dstrain({"version"}, env(), 30);
  ASSERT_EQ(version.exit_code, 0) << version.err;
  EXPECT_EQ(version.out.rfind("dstrain ", 0), 0u) << version.out;

  std::vector<std::string> check = {"--dry-run", "--check", "qwen-lora.yaml"};
  const std::vector<std::string> model = tiny_model();
  check.insert(check.end() - 1, model.begin(), model.end());
  const RunResult dry = run_dstrain(launch(check), env(), 60);
  ASSERT_EQ(dry.exit_code, 0) << dry.out << dry.err;
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(dry.out.find("check " + host(k) + ": reachable; dstrain "), std::string::npos)
        << dry.out;
  }
  EXPECT_NE(dry.out.find("LibTorch "), std::string::npos) << dry.out;
  EXPECT_NE(dry.out.find("WORLD_SIZE=4"), std::string::npos) << dry.out;

  std::vector<std::string> run = model;
  run.push_back("qwen-lora.yaml");
  const RunResult trained = run_dstrain(launch(run), env(), 420);
  ASSERT_FALSE(trained.timed_out) << trained.err;
  ASSERT_EQ(trained.exit_code, 0) << trained.out << trained.err;
  EXPECT_NE(trained.out.find("done: "), std::string::npos) << trained.out;
  EXPECT_NE(trained.out.find("checkpoint runs/qwen-lora/checkpoints/step_"), std::string::npos)
      << trained.out;
  EXPECT_TRUE(file_exists("runs/qwen-lora/lora_adapter/adapter_model.safetensors"));
  EXPECT_TRUE(file_exists("runs/qwen-lora/lora_adapter/adapter_config.json"));
  const auto losses = read_metric("runs/qwen-lora/metrics.jsonl", "train/loss");
  ASSERT_GE(losses.size(), 4u) << "log_interval: 1, about 5 steps";
  // checkpoint.interval: 2 and the final one, keep_last: 2.
  std::vector<std::string> kept;
  for (const auto& entry : stdfs::directory_iterator("runs/qwen-lora/checkpoints")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) == 0) kept.push_back(name);
  }
  std::sort(kept.begin(), kept.end());
  const long last = losses.rbegin()->first;
  char final_step[32], even_step[32];
  std::snprintf(final_step, sizeof final_step, "step_%08ld", last);
  std::snprintf(even_step, sizeof even_step, "step_%08ld", (last - 1) / 2 * 2);
  EXPECT_EQ(kept, (std::vector<std::string>{even_step, final_step}));

  const RunResult plan =
      run_dstrain({"resume", "runs/qwen-lora/checkpoints/latest", "--dry-run"}, env(), 60);
  ASSERT_EQ(plan.exit_code, 0) << plan.out << plan.err;
  EXPECT_NE(plan.out.find(host(1)), std::string::npos) << "over SSH on both hosts: " << plan.out;

  const RunResult resumed =
      run_dstrain({"resume", "runs/qwen-lora/checkpoints/latest"}, env(), 300);
  ASSERT_FALSE(resumed.timed_out) << resumed.err;
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("done: "), std::string::npos) << resumed.out;

  const RunResult exported = run_dstrain(
      {"export", "runs/qwen-lora/checkpoints/latest", "--merge-lora", "--out", "merged"}, env(),
      120);
  ASSERT_EQ(exported.exit_code, 0) << exported.out << exported.err;
  EXPECT_TRUE(file_exists("merged/config.json"));
  EXPECT_TRUE(file_exists("merged/model.safetensors"));
}

}  // namespace
}  // namespace dstrain::testing
