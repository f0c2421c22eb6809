#pragma once
// Fills a revision's snapshot in the hub cache with the files a model needs (model_files.h), the
// way huggingface_hub's snapshot_download does for those files: the revision's commit and file list
// from the repo-info endpoint, then per file a HEAD for its ETag and size, the blob fetched unless
// the cache already has it (any revision's), and the snapshot's symlink to it. refs/<revision> is
// written last, so a ref always names a snapshot that is complete.
//
// Files already in the snapshot cost no request. The caller serialises snapshot downloads of a repo
// (RepoLayout::download_lock); blobs are additionally locked one by one, as huggingface_hub locks
// them, so a concurrent Python download of the same file waits instead of writing it twice.

#include <filesystem>
#include <string>

#include "hub/hub_api.h"

namespace dstrain::hub {

struct SnapshotRequest {
  std::string repo_id;
  std::string revision = "main";
  bool weights = true;  // also the safetensors
};

// The snapshot folder, complete. Errors as HubClient's, and download_blob's.
std::filesystem::path download_snapshot(HubClient& hub, const SnapshotRequest& request);

}  // namespace dstrain::hub
