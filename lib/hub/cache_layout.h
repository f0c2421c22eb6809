#pragma once
// Every name in the Hugging Face hub cache is built here. The layout is huggingface_hub's own, so
// both tools read and write one cache:
//   <cache>/models--Org--Name/blobs/<etag>                file contents, named by the file's ETag
//                                                         (its sha256 for LFS files)
//   <cache>/models--Org--Name/blobs/<etag>.incomplete     a download in progress, resumed later
//   <cache>/models--Org--Name/snapshots/<commit>/<file>   relative symlink ../../blobs/<etag>
//   <cache>/models--Org--Name/refs/<revision>             a branch's or tag's commit (no newline)
//   <cache>/.locks/models--Org--Name/<etag>.lock          held while the blob is written (the lock
//                                                         file huggingface_hub takes for it)
//   <cache>/.locks/models--Org--Name/dstrain-download.lock  held by the one process that fills
//                                                         a snapshot; the others wait on it
// Names that come from a server (file names, ETags, revisions) are checked before they become
// paths: Error(kInput) for one that would leave its folder.

#include <filesystem>
#include <optional>
#include <string>

namespace dstrain::hub {

// A hub id: `Org/Name` or a bare `Name`, each part of [A-Za-z0-9._-], not starting with '.' or '-'.
bool is_hub_id(const std::string& s);

// A full commit hash: 40 lowercase hex digits.
bool is_commit_hash(const std::string& s);

// `models--Org--Name` for `Org/Name`.
std::string repo_folder_name(const std::string& repo_id);

class RepoLayout {
 public:
  RepoLayout(std::filesystem::path cache_dir, std::string repo_id);

  const std::string& repo_id() const { return repo_id_; }
  const std::filesystem::path& cache_dir() const { return cache_dir_; }
  std::filesystem::path dir() const;
  std::filesystem::path blob(const std::string& etag) const;
  std::filesystem::path incomplete_blob(const std::string& etag) const;
  std::filesystem::path snapshot(const std::string& commit) const;
  std::filesystem::path pointer(const std::string& commit, const std::string& filename) const;
  std::filesystem::path ref(const std::string& revision) const;
  std::filesystem::path blob_lock(const std::string& etag) const;
  std::filesystem::path download_lock() const;

  // The commit refs/<revision> names, or nullopt when there is none.
  std::optional<std::string> read_ref(const std::string& revision) const;
  // Writes refs/<revision> = commit atomically; nothing when revision is the commit itself.
  void write_ref(const std::string& revision, const std::string& commit) const;
  // Points snapshots/<commit>/<filename> at blobs/<etag> with a relative symlink, replacing any
  // entry of that name atomically.
  void link_pointer(const std::string& commit, const std::string& filename,
                    const std::string& etag) const;

 private:
  std::filesystem::path cache_dir_;
  std::string repo_id_;
};

}  // namespace dstrain::hub
