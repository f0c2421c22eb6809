#include "launcher/output.h"

#include <fcntl.h>
#include <unistd.h>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/secrets.h"

namespace dstrain::launcher {

void LineSplitter::feed(std::string_view bytes, const LineFn& on_line) {
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    size_t take = nl == std::string_view::npos ? bytes.size() : nl;
    size_t room = max_line_ - pending_.size();
    if (take > room) {  // too long: emit a full piece; the byte after it is not a newline
      pending_.append(bytes.substr(0, room));
      bytes.remove_prefix(room);
      on_line(pending_);
      pending_.clear();
      continue;
    }
    pending_.append(bytes.substr(0, take));
    if (nl == std::string_view::npos) return;
    bytes.remove_prefix(take + 1);
    on_line(pending_);
    pending_.clear();
  }
}

void LineSplitter::finish(const LineFn& on_line) {
  if (pending_.empty()) return;
  on_line(pending_);
  pending_.clear();
}

void TailBuffer::push(std::string_view line) {
  if (capacity_ == 0) return;
  if (lines_.size() == capacity_) lines_.pop_front();
  lines_.emplace_back(line);
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

RankOutput::RankOutput(int rank, const std::string& log_path, OutputTargets targets,
                       size_t tail_lines)
    : prefix_((targets.host.empty() ? "[rank " : "[" + targets.host + ":") + std::to_string(rank) +
              "] "),
      targets_(targets),
      tail_(tail_lines) {
  if (log_path.empty()) return;
  log_fd_ = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd_ < 0)
    fail(ErrorKind::kIo, "cannot create log file {}: {}", log_path, std::strerror(errno));
}

RankOutput::~RankOutput() {
  if (log_fd_ >= 0) ::close(log_fd_);
}

void RankOutput::write(Stream stream, std::string_view bytes) {
  if (log_fd_ >= 0) write_all(log_fd_, log_redactor_.feed(bytes));
  LineSplitter& splitter = stream == Stream::kStdout ? out_ : err_;
  splitter.feed(bytes, [&](std::string_view line) { emit(stream, line); });
}

void RankOutput::finish() {
  if (log_fd_ >= 0) write_all(log_fd_, log_redactor_.finish());
  out_.finish([&](std::string_view line) { emit(Stream::kStdout, line); });
  err_.finish([&](std::string_view line) { emit(Stream::kStderr, line); });
}

void RankOutput::emit(Stream stream, std::string_view raw_line) {
  const std::string line = secrets::redact(raw_line);
  tail_.push(line);
  std::string out;
  out.reserve(prefix_.size() + line.size() + 1);
  out.append(prefix_).append(line).push_back('\n');
  write_all(stream == Stream::kStdout ? targets_.stdout_fd : targets_.stderr_fd, out);
}

}  // namespace dstrain::launcher
