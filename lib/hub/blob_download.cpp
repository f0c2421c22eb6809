#include "hub/blob_download.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "hub/progress.h"
#include "hub/sha256.h"

namespace dstrain::hub {
namespace stdfs = std::filesystem;
namespace {

// The `.incomplete` file: appended to, truncated when a download starts over, hashed as it grows.
class PartialFile {
 public:
  PartialFile(const stdfs::path& path, bool hash) : path_(path), hash_(hash) {
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0) fail(ErrorKind::kIo, "cannot open {}: {}", path.string(), std::strerror(errno));
    struct stat st {};
    ::fstat(fd_, &st);
    size_ = st.st_size;
    if (hash_ && size_ > 0) hash_file_prefix(path_, size_, sha_);
    ::lseek(fd_, 0, SEEK_END);
  }
  ~PartialFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  PartialFile(const PartialFile&) = delete;
  PartialFile& operator=(const PartialFile&) = delete;

  int64_t size() const { return size_; }

  void append(const char* data, size_t n) {
    for (size_t done = 0; done < n;) {
      const ssize_t w = ::write(fd_, data + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) fail(ErrorKind::kIo, "cannot write {}: {}", path_.string(), std::strerror(errno));
      done += static_cast<size_t>(w);
    }
    if (hash_) sha_.update(data, n);
    size_ += static_cast<int64_t>(n);
  }

  void truncate() {
    if (::ftruncate(fd_, 0) != 0 || ::lseek(fd_, 0, SEEK_SET) != 0)
      fail(ErrorKind::kIo, "cannot truncate {}: {}", path_.string(), std::strerror(errno));
    sha_.reset();
    size_ = 0;
  }

  std::string sha256() { return sha_.hex_digest(); }

  void sync_and_close() {
    if (::fsync(fd_) != 0)
      fail(ErrorKind::kIo, "cannot fsync {}: {}", path_.string(), std::strerror(errno));
    ::close(fd_);
    fd_ = -1;
  }

 private:
  stdfs::path path_;
  bool hash_;
  int fd_ = -1;
  int64_t size_ = 0;
  Sha256 sha_;
};

// "bytes 100-199/200" → 100; -1 when it is not of that form.
int64_t content_range_start(const std::string& header) {
  if (header.rfind("bytes ", 0) != 0) return -1;
  const std::string digits = header.substr(6, header.find('-') - 6);
  if (digits.empty() || digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(digits);
}

void wait_before_retry(const BlobSource& src, const std::string& why, int retry, int max_retries,
                       const HttpResponse& r) {
  const double wait = backoff_seconds(retry, r);
  log::warn("{}: {}; trying again in {:.0f} s (retry {} of {})", src.filename, why, wait, retry,
            max_retries);
  std::this_thread::sleep_for(std::chrono::duration<double>(wait));
}

// Transfers the missing part of the file into `part`, until the server has sent all of it.
void fetch(HubClient& hub, const BlobSource& src, PartialFile& part, DownloadProgress& progress) {
  const int64_t size = src.size;
  int retries = 0;
  while (size < 0 || part.size() < size) {
    const int64_t asked_from = part.size();
    bool first_chunk = true;
    BodySink sink = [&](const HttpResponse& head, const char* data, size_t n) {
      if (first_chunk) {
        first_chunk = false;
        if (asked_from > 0 && head.status == 200) {  // the Range was ignored: the whole file comes
          part.truncate();
          progress.restart();
        } else if (asked_from > 0 &&
                   content_range_start(head.header("content-range")) != asked_from) {
          fail(ErrorKind::kIo, "{}: asked for bytes from {} but the answer has Content-Range '{}'",
               src.url, asked_from, head.header("content-range"));
        }
      }
      part.append(data, n);
      progress.advance(static_cast<int64_t>(n));
    };
    const HttpResponse r = hub.get_from(src.url, asked_from, sink);
    if (part.size() > asked_from) retries = 0;  // progress: count failures in a row only
    std::string why;
    if (r.error.empty() && r.status >= 200 && r.status < 300) {
      if (size < 0 || part.size() >= size) return;  // all of it (or all there is, size unknown)
      why = fmt::format("the answer ended at byte {} of {}", part.size(), size);
    } else if (r.error.empty() && r.status == 416) {
      why = fmt::format("the server refused to resume at byte {} (HTTP 416)", asked_from);
      part.truncate();
      progress.restart();
    } else if (!r.error.empty() || is_retryable_status(r.status)) {
      why = r.error.empty() ? fmt::format("HTTP {}", r.status) : r.error;
    } else {
      hub.fail_for_answer(r, src.url, src.repo_id, src.revision, src.filename);
    }
    if (++retries > hub.settings().max_retries)
      fail(ErrorKind::kIo, "downloading {} of model '{}' from {} failed {} times in a row: {}",
           src.filename, src.repo_id, src.url, retries, why);
    wait_before_retry(src, why, retries, hub.settings().max_retries, r);
  }
}

// Why the finished file is not the one announced, or "" when it is.
std::string check(const BlobSource& src, PartialFile& part) {
  if (src.size >= 0 && part.size() != src.size)
    return fmt::format("it has {} bytes, the Hub announced {}", part.size(), src.size);
  if (is_sha256(src.etag)) {
    const std::string got = part.sha256();
    if (got != src.etag) return fmt::format("its sha256 is {}, the Hub names it {}", got, src.etag);
  }
  return {};
}

}  // namespace

bool is_sha256(const std::string& s) {
  if (s.size() != 64) return false;
  for (char ch : s)
    if (!std::isdigit(static_cast<unsigned char>(ch)) && (ch < 'a' || ch > 'f')) return false;
  return true;
}

void download_blob(HubClient& hub, const BlobSource& src, const stdfs::path& blob,
                   const stdfs::path& incomplete) {
  fs::create_dirs(blob.parent_path());
  for (int attempt = 1;; ++attempt) {
    PartialFile part(incomplete, is_sha256(src.etag));
    if (src.size >= 0 && part.size() > src.size) part.truncate();  // not a prefix of this file
    DownloadProgress progress(src.filename, src.size, part.size(), stderr_is_terminal());
    fetch(hub, src, part, progress);
    progress.finish();
    const std::string wrong = check(src, part);
    if (wrong.empty()) {
      part.sync_and_close();
      std::error_code ec;
      stdfs::rename(incomplete, blob, ec);
      if (ec)
        fail(ErrorKind::kIo, "cannot rename {} to {}: {}", incomplete.string(), blob.string(),
             ec.message());
      fs::fsync_dir(blob.parent_path());
      return;
    }
    stdfs::remove(incomplete);
    if (attempt == 2)
      fail(ErrorKind::kIo, "downloaded {} of model '{}' twice and both copies are wrong: {}",
           src.filename, src.repo_id, wrong);
    log::warn("{}: {}; downloading it again from the start", src.filename, wrong);
  }
}

}  // namespace dstrain::hub
