#pragma once
// Helpers for tests that run the real `dstrain` binary: start it with pipes, wait with a deadline,
// and inspect the process table. Every wait is bounded; a child that outlives its deadline is
// killed with SIGKILL (by pid, never by name) and the result says so.

#include <sys/types.h>
#include <functional>
#include <string>
#include <vector>

namespace dstrain::testing {

struct RunResult {
  int exit_code = -1;      // exit code, or 128 + signal
  bool timed_out = false;  // the deadline passed and the child was killed
  std::string out;
  std::string err;
};

// A started `dstrain` process with its stdout/stderr piped to us.
struct Child {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
};

// Starts DSTRAIN_BINARY with `args`; `env` entries ("NAME=value") are added to our environment.
Child start_dstrain(const std::vector<std::string>& args, const std::vector<std::string>& env = {});

// Reads the child's output until it exits (reaped) or `timeout_s` passes (then SIGKILL and reap).
RunResult finish(Child& child, double timeout_s);

RunResult run_dstrain(const std::vector<std::string>& args,
                      const std::vector<std::string>& env = {}, double timeout_s = 20);

// Polls `done` every 20 ms until it is true or `timeout_s` passes; returns its last value.
bool wait_until(const std::function<bool()>& done, double timeout_s);

// Live (non-zombie) processes whose environment contains DSTRAIN_TEST_MARKER=<token>.
std::vector<pid_t> processes_with_marker(const std::string& token);

// Live (non-zombie) processes whose environment contains the entry `name_value` ("NAME=value").
std::vector<pid_t> processes_with_env(const std::string& name_value);

// The pid among `pids` whose environment has RANK=<rank>, or -1.
pid_t rank_pid(const std::vector<pid_t>& pids, int rank);

// True if `pid` exists and is not a zombie.
bool is_alive(pid_t pid);

// A fresh unique token, for DSTRAIN_TEST_MARKER.
std::string unique_token();

// A temporary directory removed on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string read_text(const std::string& path);  // "" if missing
inline bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}
bool file_exists(const std::string& path);

}  // namespace dstrain::testing
