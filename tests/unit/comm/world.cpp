#include "world.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tests/common/free_port.h"

extern char** environ;

namespace dstrain::comm::testing {
namespace {

using dstrain::testing::free_port;

std::vector<std::string> rank_env(const WorldSpec& spec, int rank, int port) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    for (const char* name :
         {"RANK=", "WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=", "DSTRAIN_COMM_TIMEOUT="}) {
      if (entry.rfind(name, 0) == 0) entry.clear();
    }
    if (!entry.empty()) env.push_back(entry);
  }
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=" + std::to_string(spec.world_size));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(port));
  env.push_back("DSTRAIN_COMM_TIMEOUT=" + std::to_string(spec.comm_timeout_s));
  env.push_back("OMP_NUM_THREADS=1");
  return env;
}

pid_t spawn_rank(const WorldSpec& spec, int rank, int port, const std::string& dir) {
  std::vector<std::string> env = rank_env(spec, rank, port);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string exe = COMM_TEST_WORKER;
  std::vector<std::string> args = {exe, spec.scenario, dir};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) {
    throw std::runtime_error("cannot start " + exe);
  }
  return pid;
}

// Waits for every pid until the deadline, then kills the rest (exit code -1).
std::vector<int> reap(const std::vector<pid_t>& pids, double deadline_s) {
  std::vector<int> codes(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(deadline_s);
  size_t remaining = pids.size();
  while (remaining > 0 && std::chrono::steady_clock::now() < deadline) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (!done[i] && waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --remaining;
        codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (!done[i]) {
      kill(pids[i], SIGKILL);
      waitpid(pids[i], nullptr, 0);
    }
  }
  return codes;
}

}  // namespace

std::vector<RankResult> run_world(const WorldSpec& spec) {
  namespace fs = std::filesystem;
  std::string dir = fs::temp_directory_path() / ("dstrain_comm_" + std::to_string(getpid()) + "_" +
                                                 std::to_string(free_port()));
  fs::create_directories(dir);
  std::vector<int> ranks = spec.ranks;
  if (ranks.empty()) {
    for (int r = 0; r < spec.world_size; ++r) ranks.push_back(r);
  }
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r : ranks) pids.push_back(spawn_rank(spec, r, port, dir));
  std::vector<int> codes = reap(pids, spec.deadline_s);
  std::vector<RankResult> results(spec.world_size);
  for (size_t i = 0; i < ranks.size(); ++i) {
    results[ranks[i]].exit_code = codes[i];
    std::ifstream in(dir + "/rank" + std::to_string(ranks[i]) + ".txt");
    std::stringstream text;
    text << in.rdbuf();
    results[ranks[i]].result = text.str();
  }
  fs::remove_all(dir);
  return results;
}

}  // namespace dstrain::comm::testing
