#include "launcher/stdin_env.h"

#include <poll.h>
#include <unistd.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/secrets.h"
#include "core/timer.h"
#include "launcher/remote_env.h"
#include "launcher/text_util.h"

namespace dstrain::launcher {
namespace {

constexpr size_t kMaxLine = 1 << 20;  // a hex value of 512 KiB; the kernel's limit is lower

std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// The value of a line, or false when it is not lowercase hex of whole bytes.
bool from_hex(const std::string& hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int high = hex_digit(hex[i]), low = hex_digit(hex[i + 1]);
    if (high < 0 || low < 0 || (high == 0 && low == 0)) return false;  // no NUL in a variable
    out->push_back(static_cast<char>(high * 16 + low));
  }
  return true;
}

// One line from `fd` without its newline; false at end of file.
bool read_line(int fd, const Stopwatch& clock, double timeout_seconds, std::string* line) {
  line->clear();
  while (true) {
    const double left = timeout_seconds - clock.seconds();
    if (left <= 0) {
      fail(ErrorKind::kComm, "the launcher's environment did not arrive on stdin within {} s",
           timeout_seconds);
    }
    pollfd in{fd, POLLIN, 0};
    int ready = ::poll(&in, 1, static_cast<int>(left * 1000) + 1);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;  // the deadline check above ends the wait
    char c = 0;
    ssize_t n = ready < 0 ? -1 : ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    if (line->size() >= kMaxLine)
      fail(ErrorKind::kUsage, "a line of the environment on stdin is too long");
    line->push_back(c);
  }
}

std::pair<std::string, std::string> parse_env_line(const std::string& line) {
  std::vector<std::string> words = split(line, ' ');
  std::string value;
  if (words.size() != 3 || words[0] != kStdinEnvLine || !is_env_name(words[1]) ||
      !from_hex(words[2], &value)) {
    // The line may hold a secret: it is not repeated.
    fail(ErrorKind::kUsage, "expected '{} NAME HEX' or '{}' on stdin, got another line",
         kStdinEnvLine, kStdinEnvEndLine);
  }
  return {words[1], value};
}

}  // namespace

std::string encode_stdin_env(const EnvList& env) {
  std::string out;
  for (const auto& [name, value] : env)
    out += std::string(kStdinEnvLine) + " " + name + " " + to_hex(value) + "\n";
  return out + kStdinEnvEndLine + "\n";
}

EnvList read_stdin_env(int fd, double timeout_seconds) {
  Stopwatch clock;
  EnvList env;
  std::string line;
  while (true) {
    if (!read_line(fd, clock, timeout_seconds, &line)) {
      fail(ErrorKind::kComm,
           "stdin ended before the launcher's environment did (the launcher "
           "exited or the connection dropped)");
    }
    if (line == kStdinEnvEndLine) return env;
    env.push_back(parse_env_line(line));
  }
}

void adopt_stdin_env(double timeout_seconds) {
  for (const auto& [name, value] : read_stdin_env(0, timeout_seconds)) {
    secrets::add_secret_names({name});
    secrets::add_secret_value(value);
    if (::setenv(name.c_str(), value.c_str(), 1) != 0) {
      fail(ErrorKind::kIo, "cannot set {} in the environment: {}", name, std::strerror(errno));
    }
  }
}

}  // namespace dstrain::launcher
