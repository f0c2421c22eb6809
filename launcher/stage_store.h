#pragma once
// A node-local, content-addressed copy of files that live on shared storage (`launch
// --stage-dir`, stage_inputs.h). Every name under the stage directory is built here:
//   <root>/blobs/sha256/<hex>    one file's bytes, named by their sha256; read-only (0444)
//   <root>/sources/<id>          what was last learnt of a source file: its path, device, inode,
//                                size, mtime and ctime (ns) and the sha256 of its bytes
//   <root>/models/<key>/<name>   a view: a directory of hard links to blobs (symbolic links where
//   <root>/data/<key>/<name>     the file system refuses hard links); <key> is the sha256 of the
//                                view's (name, sha256) list, so equal contents give one view
//   <root>/tmp/                  files and views being written
//   <root>/stage.lock            flock(2)ed by the one stager at work (hub/file_lock.h)
//
// Crash safety: a blob is written under tmp/, fsync'ed, then renamed to its final name; a view is
// filled under tmp/ and renamed whole. So a final name only ever holds complete contents, and what
// a killed stager leaves is under tmp/, which the next stager (holding the lock) empties.
//
// What is trusted, so that a re-launch reads nothing it has read before:
//  - a source file whose path, device, inode, size, mtime and ctime all equal its record has the
//    sha256 recorded then (the file is not re-read). A change that keeps all six — rewriting a file
//    in place with equal size and then resetting both times — goes unnoticed;
//  - a blob present under its name with the size of its source is intact (blobs are only written
//    as above and are read-only). A blob of another size is copied again.
//
// Concurrency: one stager at a time per stage directory. Open the store, then hold lock() for the
// whole staging; another process staging into the same directory waits for it and then reuses
// what it copied.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "hub/file_lock.h"

namespace dstrain::launcher {

// What put() did with one file.
struct StagedFile {
  std::string sha256;  // 64 lowercase hex digits
  int64_t bytes = 0;
  bool copied = false;  // false: the blob was already there (reused)
  bool hashed = false;  // the source was read (no matching record)
};

// One file of a view: its name in the view (no '/') and its blob.
struct ViewFile {
  std::string name;
  std::string sha256;
};

class StageStore {
 public:
  // Creates the folders under `root`. Error(kInput) naming the path when it cannot (the stage
  // directory is the user's choice, so an unusable one is bad input).
  explicit StageStore(std::filesystem::path root);

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path blob(const std::string& sha256) const;
  std::filesystem::path lock_file() const;

  // Takes the store's lock (waiting for another stager, `on_wait(seconds)` now and then), then
  // empties tmp/ of what an interrupted stager left.
  hub::FileLock lock(const std::function<void(double)>& on_wait = {});

  // Brings `source` (a regular file, or a symbolic link to one) into the store: reused when the
  // record and the blob say it is there, else copied (hashing while copying). Error(kInput) naming
  // the source for one that cannot be read, and naming the stage path for one that cannot be
  // written (disk full included); nothing is then left under a final name.
  StagedFile put(const std::filesystem::path& source);

  // The view of `files` under `kind` ("models" or "data"): made once (returns its directory);
  // an existing complete view is reused. Error(kInput) like put().
  std::filesystem::path view(const std::string& kind, const std::vector<ViewFile>& files);

 private:
  std::filesystem::path record_file(const std::filesystem::path& source) const;
  std::filesystem::path temp_path(const std::string& what) const;

  std::filesystem::path root_;
};

// The sha256 of the bytes of `text` (64 hex digits).
std::string sha256_of(const std::string& text);

}  // namespace dstrain::launcher
