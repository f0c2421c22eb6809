#include "hub/resolve.h"

#include <chrono>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "hub/file_lock.h"
#include "hub/hub_api.h"
#include "hub/model_files.h"
#include "hub/snapshot_download.h"

namespace dstrain::hub {
namespace stdfs = std::filesystem;
namespace {

std::optional<stdfs::path> newest_snapshot_with_config(const stdfs::path& snapshots) {
  std::optional<stdfs::path> best;
  stdfs::file_time_type best_time{};
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator(snapshots, ec)) {
    if (!stdfs::exists(e.path() / kConfigFile)) continue;
    const auto t = stdfs::last_write_time(e.path(), ec);
    if (!best || t > best_time) best = e.path(), best_time = t;
  }
  return best;
}

// The snapshot folder `revision` names in the cache (complete or not), if any.
std::optional<stdfs::path> snapshot_of(const RepoLayout& layout, const std::string& revision) {
  if (is_commit_hash(revision)) return layout.snapshot(revision);
  if (const auto commit = layout.read_ref(revision)) return layout.snapshot(*commit);
  if (revision == "main") return newest_snapshot_with_config(layout.dir() / "snapshots");
  return std::nullopt;
}

[[noreturn]] void fail_offline(const RepoLayout& layout, const ModelSource& source) {
  const auto dir = snapshot_of(layout, source.revision);
  std::string what = "no snapshot of it";
  if (dir && stdfs::is_directory(*dir)) {
    what = "the snapshot " + dir->string() + " lacks";
    for (const auto& f : missing_model_files(*dir, source.weights)) what += " " + f;
  }
  fail(ErrorKind::kInput,
       "model '{}' (revision '{}') is not in the Hugging Face cache {} ({}), and HF_HUB_OFFLINE "
       "is set, so it is not downloaded; unset it, or fetch the model first (`dstrain download "
       "{}`)",
       source.name_or_path, source.revision, layout.cache_dir().string(), what,
       source.name_or_path);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

FileLock take_download_lock(const RepoLayout& layout) {
  return FileLock::acquire(
      layout.download_lock(),
      [&](double waited) {
        log::info("waiting for another process to finish downloading {} ({:.0f} s; lock {})",
                  layout.repo_id(), waited, layout.download_lock().string());
      },
      30);
}

// Ranks other than a node's local rank 0: wait until it has the model in the cache. nullopt when
// it has not started within the grace period.
std::optional<stdfs::path> wait_for_local_rank0(const RepoLayout& layout, const ModelSource& source,
                                                const ResolveOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  while (seconds_since(start) < options.peer_grace_s) {
    {
      FileLock lock = take_download_lock(layout);  // held by rank 0 while it downloads
      if (auto dir = find_cached_model(layout, source.revision, source.weights)) return dir;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return std::nullopt;
}

stdfs::path download_once(const RepoLayout& layout, const ModelSource& source,
                          const ResolveOptions& options, const HubSettings& settings) {
  if (options.local_rank != 0) {
    if (auto dir = wait_for_local_rank0(layout, source, options)) return *dir;
    log::warn(
        "local rank {}: local rank 0 has not downloaded model '{}' within {:.0f} s; "
        "downloading it here",
        options.local_rank, source.name_or_path, options.peer_grace_s);
  }
  FileLock lock = take_download_lock(layout);
  if (auto dir = find_cached_model(layout, source.revision, source.weights)) return *dir;
  HubClient hub(settings);
  const stdfs::path dir =
      download_snapshot(hub, {source.name_or_path, source.revision, source.weights});
  const auto missing = missing_model_files(dir, source.weights);
  if (!missing.empty())
    fail(ErrorKind::kIo, "model '{}': after the download, {} still lacks {}", source.name_or_path,
         dir.string(), missing.front());
  return dir;
}

}  // namespace

std::optional<stdfs::path> find_cached_model(const RepoLayout& layout, const std::string& revision,
                                             bool weights) {
  const auto dir = snapshot_of(layout, revision);
  if (!dir || !stdfs::is_directory(*dir)) return std::nullopt;
  if (!missing_model_files(*dir, weights).empty()) return std::nullopt;
  return dir;
}

stdfs::path resolve_model_dir(const ModelSource& source, const ResolveOptions& options,
                              const HubSettings& settings) {
  const std::string& name = source.name_or_path;
  if (name.empty()) fail(ErrorKind::kInput, "model name_or_path is empty");
  const stdfs::path local(name);
  if (stdfs::is_directory(local)) {
    if (!stdfs::exists(local / kConfigFile))
      fail(ErrorKind::kInput, "model directory {} has no config.json", local.string());
    return local;
  }
  if (!is_hub_id(name))
    fail(ErrorKind::kInput, "model '{}': no such directory, and not a hub id of the form Org/Name",
         name);
  if (source.revision.empty())
    fail(ErrorKind::kInput,
         "model '{}': the revision is empty (model.revision: a branch, tag or "
         "commit; default main)",
         name);
  const RepoLayout layout(settings.cache_dir, name);
  if (auto dir = find_cached_model(layout, source.revision, source.weights)) return *dir;
  if (settings.offline) fail_offline(layout, source);
  return download_once(layout, source, options, settings);
}

stdfs::path resolve_model_dir(const ModelSource& source, const ResolveOptions& options) {
  return resolve_model_dir(source, options, settings_from_env());
}

stdfs::path download_model(const std::string& repo_id, const std::string& revision) {
  if (!is_hub_id(repo_id))
    fail(ErrorKind::kUsage, "download: '{}' is not a hub id of the form Org/Name", repo_id);
  return resolve_model_dir({repo_id, revision, true});
}

}  // namespace dstrain::hub
