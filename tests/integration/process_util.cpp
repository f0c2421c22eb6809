#include "tests/integration/process_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

namespace dstrain::testing {
namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

// Reads what is available on `fd` into `sink`; closes it at end of file.
void pump(int& fd, std::string& sink) {
  char buf[4096];
  ssize_t n = ::read(fd, buf, sizeof(buf));
  if (n > 0) {
    sink.append(buf, static_cast<size_t>(n));
  } else if (n == 0 || errno != EINTR) {
    ::close(fd);
    fd = -1;
  }
}

}  // namespace

Child start_dstrain(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  int out[2];
  int err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) std::abort();
  std::vector<std::string> argv_s = {DSTRAIN_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s = env;
  pid_t pid = ::fork();
  if (pid == 0) {
    for (std::string& e : env_s) ::putenv(e.data());
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  return Child{pid, out[0], err[0]};
}

RunResult finish(Child& child, double timeout_s) {
  RunResult result;
  double deadline = now() + timeout_s;
  while (child.out_fd >= 0 || child.err_fd >= 0) {
    if (now() > deadline) break;
    pollfd fds[2] = {{child.out_fd, POLLIN, 0}, {child.err_fd, POLLIN, 0}};
    if (::poll(fds, 2, 50) <= 0) continue;
    if (child.out_fd >= 0 && fds[0].revents) pump(child.out_fd, result.out);
    if (child.err_fd >= 0 && fds[1].revents) pump(child.err_fd, result.err);
  }
  int status = 0;
  while (::waitpid(child.pid, &status, WNOHANG) == 0) {
    if (now() > deadline) {
      result.timed_out = true;
      ::kill(child.pid, SIGKILL);
      ::waitpid(child.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int* fd : {&child.out_fd, &child.err_fd}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
  result.exit_code = exit_code_of(status);
  return result;
}

RunResult run_dstrain(const std::vector<std::string>& args, const std::vector<std::string>& env,
                      double timeout_s) {
  Child child = start_dstrain(args, env);
  return finish(child, timeout_s);
}

bool wait_until(const std::function<bool()>& done, double timeout_s) {
  double deadline = now() + timeout_s;
  while (!done()) {
    if (now() > deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

pid_t rank_pid(const std::vector<pid_t>& pids, int rank) {
  const std::string want = "RANK=" + std::to_string(rank);
  for (pid_t p : pids) {
    std::ifstream in("/proc/" + std::to_string(p) + "/environ", std::ios::binary);
    std::string var;
    while (std::getline(in, var, '\0')) {
      if (var == want) return p;
    }
  }
  return -1;
}

bool is_alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

std::vector<pid_t> processes_with_marker(const std::string& token) {
  return processes_with_env("DSTRAIN_TEST_MARKER=" + token);
}

std::vector<pid_t> processes_with_env(const std::string& needle) {
  std::vector<pid_t> found;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream environ_file(std::string("/proc/") + entry->d_name + "/environ");
    std::stringstream buffer;
    buffer << environ_file.rdbuf();
    std::string environ_text = buffer.str();
    bool has = false;
    for (size_t pos = 0; pos < environ_text.size();) {
      size_t zero = environ_text.find('\0', pos);
      if (zero == std::string::npos) zero = environ_text.size();
      has = has || environ_text.compare(pos, zero - pos, needle) == 0;
      pos = zero + 1;
    }
    if (has && is_alive(static_cast<pid_t>(pid))) found.push_back(static_cast<pid_t>(pid));
  }
  ::closedir(proc);
  return found;
}

std::string unique_token() {
  std::random_device rd;
  return std::to_string(::getpid()) + "_" + std::to_string(rd()) + std::to_string(rd());
}

TempDir::TempDir() {
  std::string pattern = std::filesystem::temp_directory_path().string() + "/dstrain_launch_XXXXXX";
  char* made = ::mkdtemp(pattern.data());
  if (made == nullptr) std::abort();
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

bool file_exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

}  // namespace dstrain::testing
