#include "metrics/sinks.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"

namespace dstrain::metrics {

const char* to_string(RunStatus status) noexcept {
  switch (status) {
    case RunStatus::kFinished:
      return "FINISHED";
    case RunStatus::kFailed:
      return "FAILED";
    case RunStatus::kKilled:
      return "KILLED";
  }
  return "FAILED";
}

double Record::get(const std::string& name, double fallback) const {
  for (const auto& [k, v] : values) {
    if (k == name) return v;
  }
  return fallback;
}

bool Record::has(const std::string& name) const {
  for (const auto& kv : values) {
    if (kv.first == name) return true;
  }
  return false;
}

JsonlSink::JsonlSink(const std::string& path, bool append) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) fs::create_dirs(parent);
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (file_ == nullptr) fail(ErrorKind::kIo, "cannot open metrics file {} for writing", path);
}

JsonlSink::~JsonlSink() {
  if (file_ != nullptr) std::fclose(file_);
}

void JsonlSink::write(const Record& record) {
  // ordered_json keeps insertion order, so lines read naturally: step, time, then the values.
  nlohmann::ordered_json j;
  j["step"] = record.step;
  j["time"] =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto& [name, value] : record.values) {
    if (std::isfinite(value)) {
      j[name] = value;
    } else {
      j[name] = nullptr;  // JSON has no NaN/Inf; null says "not a number" without breaking parsers
    }
  }
  const std::string line = j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

void MetricsLogger::write(const Record& record) {
  for (auto& s : sinks_) s->write(record);
}

bool MetricsLogger::finish(RunStatus status, double timeout_s) {
  bool first = false;
  std::call_once(finished_, [&] {
    first = true;
    for (auto& s : sinks_) s->finish(status, timeout_s);
  });
  return first;
}

}  // namespace dstrain::metrics
