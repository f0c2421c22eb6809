#include "core/fs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"

namespace dstrain::fs {
namespace {

[[noreturn]] void io_fail(const char* what, const stdfs::path& path, int err) {
  fail(ErrorKind::kIo, "cannot {} {}: {}", what, path.string(), std::strerror(err));
}

void write_all(int fd, std::string_view data, const stdfs::path& path) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      io_fail("write", path, errno);
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace

std::string read_file(const stdfs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) io_fail("read", path, errno == 0 ? ENOENT : errno);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) io_fail("read", path, errno);
  return ss.str();
}

void fsync_file(const stdfs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) io_fail("open", path, errno);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) io_fail("fsync", path, err);
}

void fsync_dir(const stdfs::path& dir) {
  const stdfs::path d = dir.empty() ? stdfs::path(".") : dir;
  int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) io_fail("open directory", d, errno);
  ::fsync(fd);  // Some file systems refuse fsync on directories; the rename is still ordered.
  ::close(fd);
}

void create_dirs(const stdfs::path& dir) {
  std::error_code ec;
  stdfs::create_directories(dir, ec);
  if (ec) fail(ErrorKind::kIo, "cannot create directory {}: {}", dir.string(), ec.message());
}

void write_file_atomic(const stdfs::path& path, std::string_view data) {
  const stdfs::path dir = path.parent_path();
  if (!dir.empty()) create_dirs(dir);
  std::random_device rd;
  const stdfs::path tmp =
      path.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) io_fail("create", tmp, errno);
  try {
    write_all(fd, data, tmp);
    if (::fsync(fd) != 0) io_fail("fsync", tmp, errno);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    io_fail("rename into", path, err);
  }
  fsync_dir(dir);
}

}  // namespace dstrain::fs
