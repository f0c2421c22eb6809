#include "launcher/stage_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "hub/sha256.h"

namespace dstrain::launcher {
namespace stdfs = std::filesystem;
namespace {

constexpr size_t kCopyChunk = size_t{1} << 20;

[[noreturn]] void fail_write(const stdfs::path& path, int err) {
  fail(ErrorKind::kInput, "stage: cannot write {}: {}", path.string(), std::strerror(err));
}

[[noreturn]] void fail_read(const stdfs::path& path, int err) {
  fail(ErrorKind::kInput, "stage: cannot read {}: {}", path.string(), std::strerror(err));
}

// Runs `body`, turning the Error(kIo) of a core/fs helper into the stage's Error(kInput).
template <typename Body>
void as_stage_error(Body body) {
  try {
    body();
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kIo) throw;
    fail(ErrorKind::kInput, "stage: {}", e.what());
  }
}

void make_dirs(const stdfs::path& dir) {
  std::error_code ec;
  stdfs::create_directories(dir, ec);
  if (ec) fail_write(dir, ec.value());
}

int64_t nanos(const timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// The identity of a source file's current contents, as far as its metadata tells.
struct SourceStat {
  uint64_t dev = 0, ino = 0;
  int64_t size = 0, mtime_ns = 0, ctime_ns = 0;
  bool operator==(const SourceStat& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns &&
           ctime_ns == o.ctime_ns;
  }
};

SourceStat to_source_stat(const struct stat& st) {
  return {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
          static_cast<int64_t>(st.st_size), nanos(st.st_mtim), nanos(st.st_ctim)};
}

SourceStat stat_source(const stdfs::path& source) {
  struct stat st {};
  if (::stat(source.c_str(), &st) != 0) fail_read(source, errno);
  if (!S_ISREG(st.st_mode))
    fail(ErrorKind::kInput, "stage: {} is not a regular file", source.string());
  return to_source_stat(st);
}

std::optional<std::string> recorded_sha256(const stdfs::path& record, const stdfs::path& source,
                                           const SourceStat& now) {
  std::error_code ec;
  if (!stdfs::exists(record, ec)) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(fs::read_file(record));
    const SourceStat then{j.at("dev").get<uint64_t>(), j.at("ino").get<uint64_t>(),
                          j.at("size").get<int64_t>(), j.at("mtime_ns").get<int64_t>(),
                          j.at("ctime_ns").get<int64_t>()};
    if (j.at("path").get<std::string>() != source.string() || !(then == now)) return std::nullopt;
    std::string sha = j.at("sha256").get<std::string>();
    if (sha.size() != 64) return std::nullopt;
    return sha;
  } catch (const std::exception&) {  // unreadable or damaged: learn the file again
    return std::nullopt;
  }
}

void write_record(const stdfs::path& record, const stdfs::path& source, const SourceStat& s,
                  const std::string& sha) {
  const nlohmann::json j = {
      {"path", source.string()}, {"dev", s.dev},           {"ino", s.ino}, {"size", s.size},
      {"mtime_ns", s.mtime_ns},  {"ctime_ns", s.ctime_ns}, {"sha256", sha}};
  as_stage_error([&] { fs::write_file_atomic(record, j.dump(1) + "\n"); });
}

// A descriptor closed on scope exit; a temp path removed on scope exit unless kept.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};
struct TempFile {
  stdfs::path path;
  bool keep = false;
  ~TempFile() {
    std::error_code ec;
    if (!keep && !path.empty()) stdfs::remove_all(path, ec);
  }
};

void write_all_to(int fd, const char* data, size_t size, const stdfs::path& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_write(path, errno);
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Copies `source` to `temp` (created new), hashing on the way; fsyncs the copy. Returns the sha256
// and fills `during` with the source's metadata seen when it was opened.
std::string copy_hashing(const stdfs::path& source, const stdfs::path& temp, SourceStat* during) {
  Fd in{::open(source.c_str(), O_RDONLY | O_CLOEXEC)};
  if (in.fd < 0) fail_read(source, errno);
  struct stat st {};
  if (::fstat(in.fd, &st) != 0) fail_read(source, errno);
  *during = to_source_stat(st);
  Fd out{::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)};
  if (out.fd < 0) fail_write(temp, errno);
  hub::Sha256 hash;
  std::vector<char> buf(kCopyChunk);
  while (true) {
    ssize_t n = ::read(in.fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_read(source, errno);
    if (n == 0) break;
    hash.update(buf.data(), static_cast<size_t>(n));
    write_all_to(out.fd, buf.data(), static_cast<size_t>(n), temp);
  }
  if (::fsync(out.fd) != 0) fail_write(temp, errno);
  if (::close(out.fd) != 0) {
    out.fd = -1;
    fail_write(temp, errno);
  }
  out.fd = -1;
  return hash.hex_digest();
}

int64_t size_or_minus_one(const stdfs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return -1;
  return static_cast<int64_t>(st.st_size);
}

void check_view_name(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos)
    fail(ErrorKind::kInput, "stage: '{}' cannot name a file of a staged view", name);
}

// Hard link (same inode, nothing copied); a symbolic link where the file system refuses.
void link_blob(const stdfs::path& blob, const stdfs::path& at) {
  if (::link(blob.c_str(), at.c_str()) == 0) return;
  if (errno != EXDEV && errno != EPERM && errno != EMLINK && errno != ENOTSUP)
    fail_write(at, errno);
  if (::symlink(blob.c_str(), at.c_str()) != 0) fail_write(at, errno);
}

}  // namespace

std::string sha256_of(const std::string& text) {
  hub::Sha256 hash;
  hash.update(text.data(), text.size());
  return hash.hex_digest();
}

StageStore::StageStore(stdfs::path root) : root_(stdfs::absolute(root).lexically_normal()) {
  make_dirs(root_);  // first, so that an unusable stage directory is the path named
  for (const char* sub : {"blobs/sha256", "sources", "models", "data", "tmp"})
    make_dirs(root_ / sub);
}

stdfs::path StageStore::blob(const std::string& sha256) const {
  return root_ / "blobs" / "sha256" / sha256;
}

stdfs::path StageStore::lock_file() const {
  return root_ / "stage.lock";
}

stdfs::path StageStore::record_file(const stdfs::path& source) const {
  return root_ / "sources" / (sha256_of(source.string()).substr(0, 32) + ".json");
}

stdfs::path StageStore::temp_path(const std::string& what) const {
  static std::atomic<int> counter{0};
  return root_ / "tmp" /
         (what + "." + std::to_string(::getpid()) + "." + std::to_string(counter++));
}

hub::FileLock StageStore::lock(const std::function<void(double)>& on_wait) {
  std::optional<hub::FileLock> held;
  as_stage_error([&] { held.emplace(hub::FileLock::acquire(lock_file(), on_wait, 10)); });
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(root_ / "tmp", ec)) {
    std::error_code ignored;
    stdfs::remove_all(entry.path(), ignored);
  }
  return std::move(*held);
}

StagedFile StageStore::put(const stdfs::path& source_path) {
  const stdfs::path source = stdfs::absolute(source_path).lexically_normal();
  const SourceStat before = stat_source(source);
  const stdfs::path record = record_file(source);
  if (auto sha = recorded_sha256(record, source, before)) {
    if (size_or_minus_one(blob(*sha)) == before.size) return {*sha, before.size, false, false};
  }
  TempFile temp{temp_path("blob")};
  SourceStat during;
  const std::string sha = copy_hashing(source, temp.path, &during);
  const stdfs::path final_blob = blob(sha);
  StagedFile out{sha, during.size, false, true};
  if (size_or_minus_one(final_blob) != during.size) {
    if (::chmod(temp.path.c_str(), 0444) != 0) fail_write(temp.path, errno);
    if (::rename(temp.path.c_str(), final_blob.c_str()) != 0) fail_write(final_blob, errno);
    temp.keep = true;
    as_stage_error([&] { fs::fsync_dir(final_blob.parent_path()); });
    out.copied = true;
  }
  // A file that changed while it was read is not recorded: the next launch reads it again.
  if (stat_source(source) == during) write_record(record, source, during, sha);
  return out;
}

stdfs::path StageStore::view(const std::string& kind, const std::vector<ViewFile>& files) {
  std::vector<ViewFile> sorted = files;
  std::sort(sorted.begin(), sorted.end(),
            [](const ViewFile& a, const ViewFile& b) { return a.name < b.name; });
  std::string manifest;
  for (const ViewFile& f : sorted) {
    check_view_name(f.name);
    manifest += f.name + "\t" + f.sha256 + "\n";
  }
  const stdfs::path dir = root_ / kind / sha256_of(manifest).substr(0, 32);
  const auto complete = [&] {
    return std::all_of(sorted.begin(), sorted.end(), [&](const ViewFile& f) {
      return size_or_minus_one(dir / f.name) == size_or_minus_one(blob(f.sha256));
    });
  };
  std::error_code ec;
  if (stdfs::is_directory(dir, ec) && complete()) return dir;
  stdfs::remove_all(dir, ec);  // a view someone emptied by hand: made again
  TempFile temp{temp_path("view")};
  make_dirs(temp.path);
  for (const ViewFile& f : sorted) link_blob(blob(f.sha256), temp.path / f.name);
  make_dirs(dir.parent_path());
  as_stage_error([&] { fs::fsync_dir(temp.path); });
  if (::rename(temp.path.c_str(), dir.c_str()) != 0) fail_write(dir, errno);
  temp.keep = true;
  as_stage_error([&] { fs::fsync_dir(dir.parent_path()); });
  return dir;
}

}  // namespace dstrain::launcher
