#include "metrics/trace_files.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <system_error>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace dstrain::metrics {
namespace stdfs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_rank_trace(const std::string& path) {
  std::error_code ec;
  if (!stdfs::is_regular_file(path, ec)) {
    fail(ErrorKind::kInput,
         "{}: no such trace file (expected a rank's trace, written with "
         "logging.trace: true)",
         path);
  }
  json j = json::parse(fs::read_file(path), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("traceEvents") ||
      !j["traceEvents"].is_array()) {
    fail(ErrorKind::kInput,
         "{}: not a trace file (expected a JSON object with a traceEvents array)", path);
  }
  return j;
}

int64_t earliest_ts(const std::vector<json>& traces) {
  int64_t earliest = std::numeric_limits<int64_t>::max();
  for (const json& t : traces) {
    for (const json& e : t["traceEvents"]) {
      if (e.value("ph", "") == "X" && e.contains("ts") && e["ts"].is_number_integer()) {
        earliest = std::min(earliest, e["ts"].get<int64_t>());
      }
    }
  }
  return earliest == std::numeric_limits<int64_t>::max() ? 0 : earliest;
}

}  // namespace

std::vector<std::string> find_rank_traces(const std::string& run_dir) {
  const std::string dir = trace_dir(run_dir);
  std::map<int, std::string> by_rank;
  std::error_code ec;
  for (stdfs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const int rank = run_files::rank_of_file(it->path().filename().string());
    if (rank >= 0) by_rank[rank] = it->path().string();
  }
  if (by_rank.empty()) {
    fail(ErrorKind::kInput,
         "{}: no rank trace files (rank-<K>.json); was the run started with logging.trace: true "
         "(or --trace)?",
         dir);
  }
  std::vector<std::string> files;
  for (auto& [rank, path] : by_rank) files.push_back(std::move(path));
  return files;
}

MergeResult merge_traces(const std::vector<std::string>& rank_files, const std::string& output) {
  std::vector<json> traces;
  for (const std::string& f : rank_files) traces.push_back(read_rank_trace(f));
  const int64_t epoch = earliest_ts(traces);
  MergeResult r;
  json events = json::array();
  json dropped = json::object();
  for (const json& t : traces) {
    for (json e : t["traceEvents"]) {
      if (e.value("ph", "") == "X") {
        e["ts"] = e.value("ts", epoch) - epoch;
        ++r.events;
      }
      events.push_back(std::move(e));
    }
    const json other = t.value("otherData", json::object());
    const uint64_t d = other.value("dropped_events", uint64_t{0});
    dropped[std::to_string(other.value("rank", r.ranks))] = d;
    r.dropped += d;
    ++r.ranks;
  }
  json merged = {{"traceEvents", std::move(events)},
                 {"displayTimeUnit", "ms"},
                 {"otherData",
                  {{"clock", "ts: microseconds after epoch_unix_us (wall clock)"},
                   {"epoch_unix_us", epoch},
                   {"ranks", r.ranks},
                   {"dropped_events", dropped}}}};
  const stdfs::path out(output);
  if (out.has_parent_path()) fs::create_dirs(out.parent_path());
  fs::write_file_atomic(out, merged.dump() + "\n");
  r.path = output;
  return r;
}

}  // namespace dstrain::metrics
