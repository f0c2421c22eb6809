#pragma once
// One file's contents into the blob store, resumably and checked.
//
// The bytes go to `<blob>.incomplete`; an existing one (left by an interrupted run of dstrain or
// of an older huggingface_hub) is resumed with `Range: bytes=N-`. A server that answers 200
// instead of 206 (it ignored the Range) or 416 (it refused it) gets the file from the start again.
// A transfer that breaks off (or stalls for HubSettings::download_timeout_s) is resumed where it
// stopped, up to HubSettings::max_retries (5) times in a row without progress, waiting 1, 2, 4, 8,
// 8 s between tries; 408/429/5xx answers are retried the same way. The finished
// file must have the size the Hub announced and, for an LFS file (its ETag is a sha256), that
// sha256; a file that fails the check is fetched once more from the start before it is an error.
// Only then is it renamed to its blob name, so a blob in the cache is always complete.
//
// The caller holds the blob's lock (RepoLayout::blob_lock), so no other process writes the same
// `.incomplete` meanwhile.

#include <cstdint>
#include <filesystem>
#include <string>

#include "hub/hub_api.h"

namespace dstrain::hub {

struct BlobSource {
  std::string repo_id;
  std::string revision;
  std::string filename;  // the file's name in the repo, for messages and the progress display
  std::string url;       // where to GET it
  std::string etag;      // a 64-digit sha256 for LFS files: checked
  int64_t size = -1;     // expected size; -1 when the Hub did not say
};

// True for 64 lowercase hex digits: an LFS file's ETag, its sha256.
bool is_sha256(const std::string& s);

// Error(kIo) when the transfer keeps failing or the file fails its check twice; the Hub's refusals
// as HubClient::fail_for_answer.
void download_blob(HubClient& hub, const BlobSource& src, const std::filesystem::path& blob,
                   const std::filesystem::path& incomplete);

}  // namespace dstrain::hub
