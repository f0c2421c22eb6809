#include "launcher/stage_inputs.h"

#include "core/bytes.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/run_files.h"
#include "core/timer.h"
#include "hub/cache_layout.h"
#include "hub/model_files.h"
#include "hub/resolve.h"
#include "hub/settings.h"
#include "launcher/output.h"
#include "launcher/stage_store.h"

namespace dstrain::launcher {
namespace stdfs = std::filesystem;
namespace {

ViewFile stage_file(StageStore& store, const stdfs::path& source, StageReport& r) {
  const StagedFile f = store.put(source);
  if (f.copied) {
    r.copied_files++;
    r.copied_bytes += f.bytes;
  } else {
    r.reused_files++;
    r.reused_bytes += f.bytes;
  }
  return {source.filename().string(), f.sha256};
}

// The folder the ranks would read the model from, or nullopt (and a note) when it is not staged.
std::optional<stdfs::path> model_source_dir(const config::ModelSection& m, bool weights,
                                            StageReport& r) {
  std::error_code ec;
  if (stdfs::is_directory(m.name_or_path, ec)) return stdfs::path(m.name_or_path);
  if (!hub::is_hub_id(m.name_or_path)) {
    r.notes.push_back(
        fmt::format("model '{}' is neither a directory nor a hub id: not staged", m.name_or_path));
    return std::nullopt;
  }
  const hub::RepoLayout layout(hub::hub_cache_dir(), m.name_or_path);
  if (auto dir = hub::find_cached_model(layout, m.revision, weights)) return *dir;
  r.notes.push_back(fmt::format(
      "model '{}' (revision '{}') is not in the Hugging Face cache {} yet: not staged (staging "
      "downloads nothing); the ranks fetch it as without staging",
      m.name_or_path, m.revision, layout.cache_dir().string()));
  return std::nullopt;
}

// The files of `dir` the ranks read (hub/model_files.h), the shards of an index included.
std::vector<std::string> model_file_names(const stdfs::path& dir, bool weights,
                                          const std::string& name) {
  std::vector<std::string> present;
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file(ec)) present.push_back(entry.path().filename().string());
  }
  if (ec) fail(ErrorKind::kInput, "stage: cannot list {}: {}", dir.string(), ec.message());
  std::vector<std::string> files = hub::model_files(present, weights, name);
  if (weights && files.back() == hub::kWeightsIndexFile) {
    for (const std::string& shard : hub::index_shards(dir / hub::kWeightsIndexFile))
      files.push_back(shard);
  }
  return files;
}

void stage_model(StageStore& store, const config::Config& c, StageReport& r) {
  const bool weights = c.model.init == "pretrained";
  const std::optional<stdfs::path> dir = model_source_dir(c.model, weights, r);
  if (!dir) return;
  std::vector<ViewFile> files;
  for (const std::string& name : model_file_names(*dir, weights, c.model.name_or_path))
    files.push_back(stage_file(store, *dir / name, r));
  r.model_dir = store.view("models", files).string();
}

// The shared cache's entries (K.json beside K.tokens) whose source is one of `sources`.
std::vector<stdfs::path> token_cache_entries(const stdfs::path& dir,
                                             const std::vector<std::string>& sources) {
  std::vector<stdfs::path> metas;
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".json") metas.push_back(entry.path());
  }
  std::sort(metas.begin(), metas.end());
  std::vector<stdfs::path> out;
  for (const stdfs::path& meta : metas) {
    std::string source;
    try {
      source = nlohmann::json::parse(fs::read_file(meta)).value("source", "");
    } catch (const std::exception&) {
      continue;  // being written, or not an entry: the ranks deal with the shared cache
    }
    stdfs::path tokens = meta;
    tokens.replace_extension(".tokens");
    if (std::find(sources.begin(), sources.end(), source) != sources.end() &&
        stdfs::is_regular_file(tokens, ec))
      out.push_back(meta);
  }
  return out;
}

void stage_token_cache(StageStore& store, const config::Config& c, StageReport& r) {
  std::vector<std::string> sources = {c.data.train_path};
  if (!c.data.eval_path.empty()) sources.push_back(c.data.eval_path);
  const stdfs::path dir = shared_token_cache_dir(c);
  std::vector<ViewFile> files;
  for (const stdfs::path& meta : token_cache_entries(dir, sources)) {
    stdfs::path tokens = meta;
    tokens.replace_extension(".tokens");
    files.push_back(stage_file(store, tokens, r));
    files.push_back(stage_file(store, meta, r));
  }
  if (files.empty()) {
    r.notes.push_back(fmt::format(
        "no tokenized cache of {} in {} yet: the ranks tokenize into it as without staging, and "
        "the next launch stages it",
        c.data.train_path, dir.string()));
    return;
  }
  r.data_cache_dir = store.view("data", files).string();
}

EnvList rank_env(const StageReport& r, const config::Config& c) {
  EnvList env;
  if (!r.model_dir.empty()) {
    env.emplace_back(kStagedModelDirEnv, r.model_dir);
    env.emplace_back(kStagedModelSourceEnv, model_source_label(c.model));
  }
  if (!r.data_cache_dir.empty()) env.emplace_back(kStagedDataCacheEnv, r.data_cache_dir);
  return env;
}

std::string files_word(int n) {
  return n == 1 ? "file" : "files";
}

}  // namespace

StageReport stage_inputs(const config::Config& config, const std::string& stage_dir) {
  Stopwatch clock;
  StageReport report;
  StageStore store(stage_dir);
  hub::FileLock lock = store.lock([&](double waited) {
    write_all(2, fmt::format("dstrain launch: stage: waiting {:.0f} s for another launch staging "
                             "into {} (it holds {})\n",
                             waited, store.root().string(), store.lock_file().string()));
  });
  stage_model(store, config, report);
  stage_token_cache(store, config, report);
  report.env = rank_env(report, config);
  report.seconds = clock.seconds();
  return report;
}

std::string format_stage_report(const StageReport& r, const std::string& host,
                                const std::string& stage_dir) {
  std::string out =
      fmt::format("stage: node {}: copied {} {} ({}), reused {} ({}) in {:.1f} s into {}\n", host,
                  r.copied_files, files_word(r.copied_files), human_bytes(r.copied_bytes, 1),
                  r.reused_files, human_bytes(r.reused_bytes, 1), r.seconds, stage_dir);
  for (const std::string& note : r.notes) out += fmt::format("stage: node {}: {}\n", host, note);
  return out;
}

std::string stage_dir_of(const std::string& flag, const config::Config& config) {
  return flag.empty() ? config.data.stage_dir : flag;
}

std::string model_source_label(const config::ModelSection& model) {
  return model.name_or_path + "@" + model.revision;
}

std::string shared_token_cache_dir(const config::Config& config) {
  return run_files::data_cache_dir(config.logging.out_dir);
}

std::string staged_model_dir(const config::ModelSection& model) {
  const char* dir = std::getenv(kStagedModelDirEnv);
  const char* source = std::getenv(kStagedModelSourceEnv);
  if (dir == nullptr || *dir == '\0' || source == nullptr) return "";
  return source == model_source_label(model) ? dir : "";
}

std::string staged_data_cache_dir() {
  const char* dir = std::getenv(kStagedDataCacheEnv);
  return dir != nullptr ? dir : "";
}

}  // namespace dstrain::launcher
