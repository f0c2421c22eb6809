#include "hub/snapshot_download.h"

#include <algorithm>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "hub/blob_download.h"
#include "hub/cache_layout.h"
#include "hub/file_lock.h"
#include "hub/model_files.h"

namespace dstrain::hub {
namespace stdfs = std::filesystem;
namespace {

// One file of the snapshot: a symlink to its blob, fetching the blob when no revision has it.
void fetch_file(HubClient& hub, const RepoLayout& layout, const std::string& commit,
                const std::string& revision, const std::string& filename) {
  if (stdfs::exists(layout.pointer(commit, filename))) return;  // exists() follows the link
  const FileMetadata meta = hub.file_metadata(layout.repo_id(), commit, filename);
  const stdfs::path blob = layout.blob(meta.etag);
  const stdfs::path lock_file = layout.blob_lock(meta.etag);
  FileLock lock = FileLock::acquire(
      lock_file,
      [&](double waited) {
        log::info("waiting for another process downloading {} ({:.0f} s; lock {})", filename,
                  waited, lock_file.string());
      },
      30);
  if (!stdfs::exists(blob)) {
    BlobSource src{layout.repo_id(), revision, filename, meta.location, meta.etag, meta.size};
    download_blob(hub, src, blob, layout.incomplete_blob(meta.etag));
  }
  layout.link_pointer(commit, filename, meta.etag);
}

}  // namespace

stdfs::path download_snapshot(HubClient& hub, const SnapshotRequest& request) {
  const RepoLayout layout(hub.settings().cache_dir, request.repo_id);
  const RepoRevision info = hub.repo_revision(request.repo_id, request.revision);
  const std::vector<std::string> files = model_files(info.files, request.weights, request.repo_id);
  log::info("model {} (revision {}, commit {}): fetching into {}", request.repo_id,
            request.revision, info.commit.substr(0, 12), layout.snapshot(info.commit).string());
  for (const auto& f : files) fetch_file(hub, layout, info.commit, request.revision, f);
  if (std::find(files.begin(), files.end(), kWeightsIndexFile) != files.end()) {
    const std::set<std::string> listed(info.files.begin(), info.files.end());
    for (const auto& shard : index_shards(layout.pointer(info.commit, kWeightsIndexFile))) {
      if (!listed.count(shard))
        fail(ErrorKind::kInput, "model '{}': {} names the shard {}, which the repo does not have",
             request.repo_id, kWeightsIndexFile, shard);
      fetch_file(hub, layout, info.commit, request.revision, shard);
    }
  }
  layout.write_ref(request.revision, info.commit);
  return layout.snapshot(info.commit);
}

}  // namespace dstrain::hub
