#include "core/run_files.h"

#include <algorithm>
#include <filesystem>

namespace dstrain::run_files {
namespace {

namespace stdfs = std::filesystem;

constexpr const char* kRankPrefix = "rank-";
constexpr const char* kRankSuffix = ".json";

std::string in(const std::string& dir, const std::string& name) {
  return (stdfs::path(dir) / name).string();
}

std::string rank_file(int rank) {
  return kRankPrefix + std::to_string(rank) + kRankSuffix;
}

}  // namespace

std::string metrics_file(const std::string& out_dir, const std::string& metrics_path) {
  return metrics_path.empty() ? in(out_dir, "metrics.jsonl") : metrics_path;
}

std::string summary_file(const std::string& out_dir) {
  return in(out_dir, "summary.json");
}

std::string config_file(const std::string& out_dir) {
  return in(out_dir, "config.yaml");
}

std::string restarts_file(const std::string& out_dir) {
  return in(out_dir, "restarts.json");
}

std::string report_file(const std::string& out_dir) {
  return in(out_dir, "report.html");
}

std::string trace_dir(const std::string& out_dir) {
  return in(out_dir, "trace");
}

std::string rank_trace_file(const std::string& out_dir, int rank) {
  return in(trace_dir(out_dir), rank_file(rank));
}

std::string merged_trace_file(const std::string& out_dir) {
  return in(trace_dir(out_dir), "trace.json");
}

int rank_of_file(const std::string& name) {
  const std::string prefix = kRankPrefix, suffix = kRankSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    return -1;
  }
  const std::string digits =
      name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (digits.size() > 6 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoi(digits);
}

std::string profile_file(const std::string& out_dir, int rank) {
  return in(in(out_dir, "profile"), rank_file(rank));
}

std::string tensorboard_dir(const std::string& out_dir, const std::string& tensorboard_dir) {
  return tensorboard_dir.empty() ? in(out_dir, "tb") : tensorboard_dir;
}

std::string mlflow_run_id_file(const std::string& out_dir) {
  return in(out_dir, "mlflow_run_id");
}

std::string lora_adapter_dir(const std::string& out_dir) {
  return in(out_dir, "lora_adapter");
}

std::string data_cache_dir(const std::string& out_dir) {
  return in(out_dir, "data_cache");
}

}  // namespace dstrain::run_files
