#include "core/teardown_reason.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "core/error.h"

namespace dstrain::teardown {
namespace {

constexpr std::string_view kTag = "rank-failed";
constexpr size_t kMaxLine = 511;  // without the newline; well under PIPE_BUF (4096 on Linux)

std::string one_field(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

// The next tab-separated field of `rest`, which loses it and its tab.
std::string_view take_field(std::string_view& rest) {
  const size_t tab = rest.find('\t');
  const std::string_view field = rest.substr(0, tab);
  rest = tab == std::string_view::npos ? std::string_view() : rest.substr(tab + 1);
  return field;
}

}  // namespace

std::string describe(const RankFailure& failure) {
  std::string out = failure.rank >= 0 ? "rank " + std::to_string(failure.rank) : "a rank";
  if (!failure.host.empty()) out += " on " + failure.host;
  out += " failed";
  if (!failure.cause.empty()) out += ": " + failure.cause;
  return out;
}

std::string encode(const RankFailure& failure) {
  std::string line = std::string(kTag) + '\t' + std::to_string(failure.rank) + '\t' +
                     one_field(failure.host).substr(0, 255) + '\t' + one_field(failure.cause);
  if (line.size() > kMaxLine) line.resize(kMaxLine);
  return line;
}

std::optional<RankFailure> decode(std::string_view line) {
  std::string_view rest = line;
  if (take_field(rest) != kTag) return std::nullopt;
  const std::string_view rank = take_field(rest);
  RankFailure failure;
  const auto [end, ec] = std::from_chars(rank.data(), rank.data() + rank.size(), failure.rank);
  if (ec != std::errc() || end != rank.data() + rank.size() || failure.rank < -1) {
    return std::nullopt;
  }
  failure.host = std::string(take_field(rest));
  failure.cause = std::string(rest);
  return failure;
}

bool send(int fd, const RankFailure& failure) {
  const std::string line = encode(failure) + '\n';
  ssize_t n;
  do {
    n = ::write(fd, line.data(), line.size());
  } while (n < 0 && errno == EINTR);
  return n == static_cast<ssize_t>(line.size());
}

int reason_fd_from_env() {
  const char* text = std::getenv(kTeardownFdVar);
  if (text == nullptr || *text == '\0') return -1;
  const std::string_view value(text);
  int fd = -1;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), fd);
  if (ec != std::errc() || end != value.data() + value.size() || fd < 0) {
    fail(ErrorKind::kUsage, "environment variable {}='{}' is not a file descriptor number",
         kTeardownFdVar, text);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) return -1;
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

std::optional<double> grace_from_env() {
  const char* text = std::getenv(kGraceVar);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  // !(value >= 0) also refuses NaN.
  if (*end != '\0' || errno == ERANGE || !(value >= 0) || !std::isfinite(value)) {
    fail(ErrorKind::kUsage,
         "environment variable {}='{}': expected a number of seconds >= 0 (the launcher's --grace)",
         kGraceVar, text);
  }
  return value;
}

std::optional<RankFailure> receive(int fd) {
  if (fd < 0) return std::nullopt;
  std::string text;
  char buf[kMaxLine + 1];
  while (text.find('\n') == std::string::npos) {
    // poll() first: the launcher keeps its end open, so a read() with nothing there would block.
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) != 1 || (p.revents & POLLIN) == 0) break;
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return decode(std::string_view(text).substr(0, text.find('\n')));
}

}  // namespace dstrain::teardown
