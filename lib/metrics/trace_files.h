#pragma once
// The trace files of a run (logging.trace) and their merge. Their names (core/run_files.h):
//
//   <out_dir>/trace/rank-<K>.json   written by rank K at the end of its process lifetime
//                                    (core/trace.h: Trace Event Format, pid = K, absolute clock)
//   <out_dir>/trace/trace.json      the ranks merged: one process per rank, timestamps rebased to
//                                    the earliest event of the run; written by rank 0 after the
//                                    ranks are done, or by `dstrain trace merge RUN_DIR`
//
// Merging needs no clock exchange: every rank stamps its events with wall-clock microseconds
// advanced by the monotonic clock (core/trace.h), so ranks on one host line up exactly and ranks on
// different hosts as well as their clocks are synchronised.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/run_files.h"

namespace dstrain::metrics {

using run_files::merged_trace_file;
using run_files::rank_trace_file;
using run_files::trace_dir;

// The rank trace files under <run_dir>/trace, ordered by rank. Error(kInput) naming the directory
// when it holds none.
std::vector<std::string> find_rank_traces(const std::string& run_dir);

struct MergeResult {
  std::string path;      // the merged file written
  int ranks = 0;         // rank files merged
  size_t events = 0;     // complete ("X") events in the merged trace
  uint64_t dropped = 0;  // events the ranks could not keep (their buffers were full)
};

// Merges `rank_files` into one trace at `output` (written atomically). A file that is missing or
// not a rank trace is Error(kInput) naming it; nothing is written then.
MergeResult merge_traces(const std::vector<std::string>& rank_files, const std::string& output);

}  // namespace dstrain::metrics
