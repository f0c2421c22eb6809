// Secrets stay secret (docs/launch.md, "Secrets"): a token planted in the launcher's environment
// reaches every rank — each rank prints the sha256 of what it got, never the value — and appears in
// nothing dstrain prints or records (console, summaries, dry runs, log files, the run's files) nor
// in the command line of any process on the machine while a 2-host SSH job sets up. The SSH hosts
// log in slowly (a 0.5 s login rc), as shared nodes do, so the remote setup command lives long
// enough to be sampled; the test checks that it was.

#include <dirent.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/integration/shell_util.h"
#include "tests/integration/ssh_cluster.h"
#include "tests/integration/ssh_fixture.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

namespace fs = std::filesystem;

// A value no output could contain by chance.
std::string planted(const std::string& prefix) {
  return prefix + unique_token();
}

// sha256 of `value`, computed without putting the value on a command line.
std::string sha256_of(const TempDir& dir, const std::string& value) {
  const std::string path = dir.file("value_to_hash");
  std::ofstream(path) << value;
  std::string out = shell_output("sha256sum < '" + path + "'");
  fs::remove(path);
  return out.substr(0, 64);
}

// A rank script printing "<label>-sha=<sha256 of $NAME>", then "leak: $NAME" on stdout and stderr,
// as a careless program would.
std::string probe_script(const std::vector<std::pair<std::string, std::string>>& label_and_name) {
  std::string script;
  for (const auto& [label, name] : label_and_name) {
    script += "echo \"" + label + "-sha=$(printf %s \"$" + name +
              "\" | sha256sum | cut -c1-64)\"; echo \"leak: $" + name + "\"; echo \"leak: $" +
              name + "\" >&2; ";
  }
  return script;
}

// Every regular file under `dir` whose contents include `needle`.
std::vector<std::string> files_containing(const std::string& dir, const std::string& needle) {
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && contains(read_text(entry.path().string()), needle))
      found.push_back(entry.path().string());
  }
  return found;
}

// Samples /proc/*/cmdline of every process on the machine, as any user of a shared node could,
// from its own thread until stopped (or 120 s at most), and records every command line holding one
// of the needles and whether the remote setup command was seen at all.
class CmdlineSampler {
 public:
  explicit CmdlineSampler(std::vector<std::string> needles) : needles_(std::move(needles)) {
    thread_ = std::thread([this] { run(); });
  }
  ~CmdlineSampler() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // pid -> its command line, for every process seen holding a needle.
  const std::map<int, std::string>& hits() const { return hits_; }
  // The nodes (--node-rank K) whose setup command was seen.
  const std::set<int>& setup_nodes_seen() const { return setup_nodes_; }
  int passes() const { return passes_; }

 private:
  void run() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!stop_ && std::chrono::steady_clock::now() < deadline) {
      sample_once();
      ++passes_;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  static int node_rank_in(const std::string& cmdline) {
    const std::string flag = "--node-rank ";
    size_t at = cmdline.find(flag);
    return at == std::string::npos ? -1 : std::atoi(cmdline.c_str() + at + flag.size());
  }

  void sample_once() {
    DIR* proc = ::opendir("/proc");
    if (proc == nullptr) return;
    while (dirent* entry = ::readdir(proc)) {
      int pid = std::atoi(entry->d_name);
      if (pid <= 0) continue;
      std::string cmdline = read_text("/proc/" + std::to_string(pid) + "/cmdline");
      for (char& c : cmdline) c = c == '\0' ? ' ' : c;
      // The agent's setup script, run by the remote login shell: `test -x ...; exec ... launch`.
      if (contains(cmdline, "test -x") && contains(cmdline, "--env-on-stdin"))
        setup_nodes_.insert(node_rank_in(cmdline));
      for (const std::string& needle : needles_) {
        if (contains(cmdline, needle)) hits_.emplace(pid, cmdline);
      }
    }
    ::closedir(proc);
  }

  std::vector<std::string> needles_;
  std::atomic<bool> stop_{false};
  std::map<int, std::string> hits_;
  std::set<int> setup_nodes_;
  int passes_ = 0;
  std::thread thread_;
};

TEST(LaunchSecrets, LocalRanksGetTheTokenAndNothingPrintsOrLogsIt) {
  TempDir dir;
  const std::string token = planted("hf_planted_");
  const std::string named = planted("named_value_");
  // Rank 1 fails once rank 0 has printed (the failure stops rank 0), so that its last lines are in
  // the summary.
  const std::string script =
      probe_script({{"token", "HF_TOKEN"}, {"named", "PROBE_NAMED"}}) +
      "[ \"$RANK\" = 0 ] && { touch \"$SYNC_DIR/printed\"; exit 0; }; i=0; "
      "while [ ! -e \"$SYNC_DIR/printed\" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; "
      "exit 3";
  RunResult r =
      run_dstrain({"launch", "--nproc", "2", "--log-dir", dir.file("logs"), "--secret-env",
                   "PROBE_NAMED", "--exec", "--", "sh", "-c", script},
                  {"HF_TOKEN=" + token, "PROBE_NAMED=" + named, "SYNC_DIR=" + dir.path()}, 60);
  ASSERT_FALSE(r.timed_out) << r.err;
  EXPECT_EQ(r.exit_code, 3) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, prefix + "token-sha=" + sha256_of(dir, token))) << r.out;
    EXPECT_TRUE(contains(r.out, prefix + "named-sha=" + sha256_of(dir, named))) << r.out;
    EXPECT_TRUE(contains(r.out, prefix + "leak: <redacted>")) << r.out;
  }
  EXPECT_TRUE(contains(r.err, "last 6 line(s) of rank 1:")) << r.err;
  EXPECT_TRUE(contains(r.err, "    | leak: <redacted>")) << r.err;
  for (const std::string& value : {token, named}) {
    EXPECT_FALSE(contains(r.out, value)) << r.out;
    EXPECT_FALSE(contains(r.err, value)) << r.err;
    EXPECT_EQ(files_containing(dir.file("logs"), value), std::vector<std::string>{});
  }
  EXPECT_TRUE(contains(read_text(dir.file("logs/rank_0.log")), "leak: <redacted>"));

  // The dry run shows a secret given as a program argument redacted as well.
  RunResult dry =
      run_dstrain({"launch", "--nproc", "1", "--dry-run", "--exec", "--", "echo", token},
                  {"HF_TOKEN=" + token}, 20);
  EXPECT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_TRUE(contains(dry.out, "echo <redacted>\n")) << dry.out;
  EXPECT_FALSE(contains(dry.out + dry.err, token)) << dry.out;
}

// A real training run with the token in every rank's environment: the run's files (metrics,
// summary, report, config, traces, TensorBoard events), its checkpoint and its output never hold
// it.
TEST(LaunchSecrets, TrainingRunFilesAndOutputNeverHoldTheToken) {
  TempDir dir;
  JobSpec spec;
  spec.nproc = 2;
  spec.max_steps = 3;
  const std::string config = write_job_config(dir.path(), spec);
  const std::string token = planted("hf_planted_");
  RunResult r = run_dstrain({"launch", "--nproc", "2", config, "--set", "logging.trace=true"},
                            {"HF_TOKEN=" + token}, 300);
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string run = dir.file("run");
  for (const char* file :
       {"metrics.jsonl", "summary.json", "report.html", "config.yaml", "trace/trace.json"})
    EXPECT_TRUE(file_exists(run + "/" + file)) << file;
  EXPECT_EQ(files_containing(run, token), std::vector<std::string>{});
  if (file_exists(dir.file("ckpt"))) {
    EXPECT_EQ(files_containing(dir.file("ckpt"), token), std::vector<std::string>{});
  }
  EXPECT_FALSE(contains(r.out + r.err, token));
}

// Two hosts whose logins take 0.5 s (a slow rc file), so that the remote setup command lives long
// enough to be sampled from /proc.
class LaunchSecretsSsh : public SshFixture {
 protected:
  LaunchSecretsSsh() : SshFixture(2, 2, "sleep 0.5") {}

  std::vector<std::string> args(const std::vector<std::string>& extra, const std::string& script) {
    std::vector<std::string> a = launch_args(extra);
    a.insert(a.end(), {"--exec", "--", "/bin/sh", "-c", script});
    return a;
  }
};

TEST_F(LaunchSecretsSsh, TwoHostLaunchKeepsTheTokenOffEveryCommandLineAndOutput) {
  const std::string token = planted("hf_planted_");
  const std::string named = planted("named_value_");
  const std::vector<std::string> env = {"DSTRAIN_TEST_MARKER=" + token_,
                                        "SSH_AUTH_SOCK=", "HF_TOKEN=" + token,
                                        "PROBE_NAMED=" + named};
  const std::string script =
      probe_script({{"token", "HF_TOKEN"}, {"named", "PROBE_NAMED"}}) + "sleep 0.5";
  const std::vector<std::string> flags = {"--secret-env", "PROBE_NAMED", "--log-dir",
                                          tmp_.file("logs")};

  std::vector<std::string> dry_args = args(flags, script);
  dry_args.insert(dry_args.begin() + 1, "--dry-run");
  RunResult dry = run_dstrain(dry_args, env, 20);
  EXPECT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_TRUE(contains(dry.out,
                       "on the connection (stdin), never on a command line: "
                       "HF_TOKEN=<redacted> PROBE_NAMED=<redacted>"))
      << dry.out;
  EXPECT_FALSE(contains(dry.out + dry.err, token)) << dry.out;
  EXPECT_FALSE(contains(dry.out + dry.err, named)) << dry.out;

  CmdlineSampler sampler({token, named});
  RunResult r = run_dstrain(args(flags, script), env, 90);
  sampler.stop();
  ASSERT_FALSE(r.timed_out) << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(sampler.hits(), (std::map<int, std::string>{}));
  EXPECT_EQ(sampler.setup_nodes_seen(), (std::set<int>{0, 1}))
      << "the setup command of each host must have been sampled (" << sampler.passes()
      << " passes)";
  for (int rank = 0; rank < 4; ++rank) {
    const std::string prefix =
        "[" + cluster_->address(rank / 2) + ":" + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, prefix + "token-sha=" + sha256_of(tmp_, token))) << r.out;
    EXPECT_TRUE(contains(r.out, prefix + "named-sha=" + sha256_of(tmp_, named))) << r.out;
    EXPECT_TRUE(contains(r.out, prefix + "leak: <redacted>")) << r.out;
    EXPECT_TRUE(contains(r.err, prefix + "leak: <redacted>")) << r.err;
  }
  for (const std::string& value : {token, named}) {
    EXPECT_FALSE(contains(r.out, value)) << r.out;
    EXPECT_FALSE(contains(r.err, value)) << r.err;
    EXPECT_EQ(files_containing(tmp_.file("logs"), value), std::vector<std::string>{});
  }
  EXPECT_TRUE(wait_until([&] { return processes_with_marker(token_).empty(); }, 10));
}

}  // namespace
}  // namespace dstrain::testing
