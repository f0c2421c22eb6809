#pragma once
// The restarts of one run, as `dstrain launch --max-restarts` records them in
// <out_dir>/restarts.json so that everything a user reads stays one run: rank 0 copies them into
// summary.json, tags the MLflow run, and the run report marks them on its charts.
//
// File: {"restarts": [{"attempt": 1, "time": "2026-11-26T13:00:00Z", "rank": 1, "host": "n2",
//        "cause": "signal SIGKILL (9)", "exit_code": 137, "step": 42, "resumed_from":
//        "step_00000040", "counted": true}, ...]}
// `attempt` is the attempt that failed (0 = the first start); `step` the last step the run had
// logged when it failed (-1: none); `resumed_from` the checkpoint tag the next attempt starts from
// ("" = from the start); `counted` whether it was charged against --max-restarts (a failure after a
// new checkpoint commit is not: the run made progress).

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/run_files.h"

namespace dstrain::metrics {

struct RestartRecord {
  int attempt = 0;
  std::string time;  // UTC, ISO 8601
  int rank = -1;     // the root-cause rank; -1 when no rank was to blame (a lost node)
  std::string host;
  std::string cause;  // "exit code 3", "signal SIGKILL (9)", "node n2 lost: ..."
  int exit_code = 0;
  long step = -1;
  std::string resumed_from;
  bool counted = true;
};

// <out_dir>/restarts.json.
using run_files::restarts_file;

// The records of a restarts file; none when it does not exist. Error(kInput) naming the file when
// it is not what this module writes.
std::vector<RestartRecord> read_restarts(const std::string& file);

// The records as the file's "restarts" array (also summary.json's "restart_causes").
nlohmann::json to_json(const std::vector<RestartRecord>& records);

// Replaces <out_dir>/restarts.json atomically (an empty list removes it).
void write_restarts(const std::string& out_dir, const std::vector<RestartRecord>& records);

// The last step logged in a metrics.jsonl file (-1 when there is none, or no file).
long last_logged_step(const std::string& metrics_file);

}  // namespace dstrain::metrics
