#include "hub/cache_layout.h"

#include <unistd.h>

#include <cctype>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/fs.h"

namespace dstrain::hub {
namespace stdfs = std::filesystem;
namespace {

bool name_char(char ch) {
  return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
}

// One path component from a server: non-empty, not "." or "..", no '/' or NUL.
bool safe_component(const std::string& s) {
  if (s.empty() || s == "." || s == "..") return false;
  for (char ch : s)
    if (ch == '/' || ch == '\0') return false;
  return true;
}

// A relative path of safe components ("sub/dir/file.json").
bool safe_relative_path(const std::string& s) {
  size_t start = 0;
  while (true) {
    const size_t slash = s.find('/', start);
    if (!safe_component(s.substr(start, slash - start))) return false;
    if (slash == std::string::npos) return true;
    start = slash + 1;
  }
}

const std::string& checked(const std::string& value, bool ok, const char* what) {
  if (!ok)
    fail(ErrorKind::kInput, "the Hub gave {} '{}', which is not a safe file name", what, value);
  return value;
}

const std::string& checked_etag(const std::string& etag) {
  bool ok = !etag.empty() && etag != "." && etag != "..";
  for (char ch : etag) ok = ok && name_char(ch);
  return checked(etag, ok, "the ETag");
}

}  // namespace

bool is_hub_id(const std::string& s) {
  if (s.empty() || s.front() == '/' || s.back() == '/') return false;
  int slashes = 0;
  bool part_start = true;
  for (char ch : s) {
    if (ch == '/') {
      if (part_start) return false;
      ++slashes;
      part_start = true;
      continue;
    }
    if (!name_char(ch) || (part_start && (ch == '.' || ch == '-'))) return false;
    part_start = false;
  }
  return slashes <= 1;
}

bool is_commit_hash(const std::string& s) {
  if (s.size() != 40) return false;
  for (char ch : s)
    if (!std::isdigit(static_cast<unsigned char>(ch)) && (ch < 'a' || ch > 'f')) return false;
  return true;
}

std::string repo_folder_name(const std::string& repo_id) {
  std::string folder = "models--" + repo_id;
  for (size_t p = folder.find('/'); p != std::string::npos; p = folder.find('/'))
    folder.replace(p, 1, "--");
  return folder;
}

RepoLayout::RepoLayout(stdfs::path cache_dir, std::string repo_id)
    : cache_dir_(std::move(cache_dir)), repo_id_(std::move(repo_id)) {}

stdfs::path RepoLayout::dir() const {
  return cache_dir_ / repo_folder_name(repo_id_);
}
stdfs::path RepoLayout::blob(const std::string& etag) const {
  return dir() / "blobs" / checked_etag(etag);
}
stdfs::path RepoLayout::incomplete_blob(const std::string& etag) const {
  return dir() / "blobs" / (checked_etag(etag) + ".incomplete");
}
stdfs::path RepoLayout::snapshot(const std::string& commit) const {
  return dir() / "snapshots" / checked(commit, safe_component(commit), "the commit");
}
stdfs::path RepoLayout::pointer(const std::string& commit, const std::string& filename) const {
  return snapshot(commit) / checked(filename, safe_relative_path(filename), "the file name");
}
stdfs::path RepoLayout::ref(const std::string& revision) const {
  return dir() / "refs" / checked(revision, safe_relative_path(revision), "the revision");
}
stdfs::path RepoLayout::blob_lock(const std::string& etag) const {
  return cache_dir_ / ".locks" / repo_folder_name(repo_id_) / (checked_etag(etag) + ".lock");
}
stdfs::path RepoLayout::download_lock() const {
  return cache_dir_ / ".locks" / repo_folder_name(repo_id_) / "dstrain-download.lock";
}

std::optional<std::string> RepoLayout::read_ref(const std::string& revision) const {
  std::ifstream in(ref(revision));
  std::string commit;
  if (!(in >> commit) || commit.empty()) return std::nullopt;
  return commit;
}

void RepoLayout::write_ref(const std::string& revision, const std::string& commit) const {
  if (revision == commit) return;
  if (read_ref(revision) == commit) return;  // unchanged: a read-only cache stays usable
  fs::write_file_atomic(ref(revision), commit);
}

void RepoLayout::link_pointer(const std::string& commit, const std::string& filename,
                              const std::string& etag) const {
  const stdfs::path link = pointer(commit, filename);
  fs::create_dirs(link.parent_path());
  // snapshots/<commit>/<a>/<b> → ../../../blobs/<etag>: one "../" per level below the repo dir.
  stdfs::path target;
  for (auto p = link.parent_path(); p != dir() && p.has_relative_path(); p = p.parent_path())
    target /= "..";
  target /= stdfs::path("blobs") / checked_etag(etag);
  std::random_device rd;
  const stdfs::path tmp =
      link.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rd());
  std::error_code ec;
  stdfs::create_symlink(target, tmp, ec);
  if (!ec) stdfs::rename(tmp, link, ec);
  if (ec) {
    stdfs::remove(tmp);
    fail(ErrorKind::kIo, "cannot create the symlink {} -> {}: {}", link.string(), target.string(),
         ec.message());
  }
}

}  // namespace dstrain::hub
