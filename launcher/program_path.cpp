#include "launcher/program_path.h"

#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace dstrain::launcher {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string self_executable() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n < 0) fail(ErrorKind::kIo, "cannot read /proc/self/exe: {}", std::strerror(errno));
  return std::string(buf, static_cast<size_t>(n));
}

std::string worker_executable() {
  std::string self = self_executable();
  size_t slash = self.rfind('/');
  std::string dir = self.substr(0, slash + 1);
  if (self.compare(slash + 1, std::string::npos, kWorkerName) == 0) return self;
  return dir + kWorkerName;
}

std::string launcher_executable() {
  std::string self = self_executable();
  size_t slash = self.rfind('/');
  if (self.compare(slash + 1, std::string::npos, kWorkerName) != 0) return self;
  std::string beside = self.substr(0, slash + 1) + "dstrain";
  return is_executable_file(beside) ? beside : self;
}

std::string resolve_program(const std::string& name) {
  if (name.empty()) fail(ErrorKind::kUsage, "--exec needs a program to run");
  if (name.find('/') != std::string::npos) {
    if (!is_executable_file(name)) {
      fail(ErrorKind::kUsage, "--exec program '{}' is not an executable file", name);
    }
    return name;
  }
  const char* env_path = std::getenv("PATH");
  std::string path = env_path ? env_path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (is_executable_file(candidate)) return candidate;
    start = end + 1;
  }
  fail(ErrorKind::kUsage, "--exec program '{}' was not found on PATH ({})", name, path);
}

}  // namespace dstrain::launcher
