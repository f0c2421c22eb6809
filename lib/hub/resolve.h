#pragma once
// Where the model a run config names lives on disk, downloading it from the Hugging Face Hub when
// it is a hub id that the cache does not hold yet.
//
// `name_or_path` is a local directory holding config.json, or a hub id (`Org/Name`, or a bare
// `Name`). A hub id is looked up in the hub cache (settings.h) at `revision` (a branch, tag or full
// commit; refs/<revision> names the commit of a branch or tag; for "main" without refs/main, the
// newest snapshot is taken, as in a cache copied without its refs). A snapshot found there that
// holds the model (model_files.h) is used without any request, whoever downloaded it. Otherwise,
// unless HF_HUB_OFFLINE is set, the missing files are downloaded (snapshot_download.h).
//
// Several processes resolving one model, on one node or on nodes sharing the cache over NFS,
// download it once: the downloader holds the repo's download lock in the cache, the others wait on
// it and then find the snapshot complete. Of the ranks of a node, local rank 0 downloads; the
// others wait for it, and download themselves only if it has not taken the lock after
// `peer_grace_s` (a rank 0 that died is noticed by the launcher long before).

#include <filesystem>
#include <optional>
#include <string>

#include "hub/cache_layout.h"
#include "hub/settings.h"

namespace dstrain::hub {

struct ModelSource {
  std::string name_or_path;
  std::string revision = "main";
  bool weights = true;  // false: config.json (and tokenizer files) are enough
};

struct ResolveOptions {
  int local_rank = 0;
  double peer_grace_s = 60;
};

// The model's directory. Error(kInput) for a name that is neither a directory with config.json nor
// a hub id, for a model that is not cached while offline, and for the Hub's refusals (hub_api.h);
// Error(kIo) when the Hub cannot be reached or a download fails.
std::filesystem::path resolve_model_dir(const ModelSource& source, const ResolveOptions& options,
                                        const HubSettings& settings);
std::filesystem::path resolve_model_dir(const ModelSource& source,
                                        const ResolveOptions& options = {});

// The cached snapshot of `revision` that holds the model, without any request; nullopt if none.
std::optional<std::filesystem::path> find_cached_model(const RepoLayout& layout,
                                                       const std::string& revision, bool weights);

// `dstrain download`: the model `repo_id` at `revision` with its weights in the cache (fetched
// unless already there); returns its snapshot folder. Error(kUsage) when repo_id is not a hub id.
std::filesystem::path download_model(const std::string& repo_id, const std::string& revision);

}  // namespace dstrain::hub
