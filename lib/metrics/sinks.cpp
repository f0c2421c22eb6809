#include "metrics/sinks.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"

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

namespace {

// Drops the lines of `path` that a run resumed at `step` writes again (see JsonlSink).
void keep_steps_up_to(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return;
  const std::string text = fs::read_file(path);
  std::string kept;
  int64_t dropped = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    const bool complete = end != std::string::npos;
    if (!complete) end = text.size();
    const std::string_view line(text.data() + begin, end - begin);
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (complete && j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= step) {
      kept.append(line).push_back('\n');
    } else if (!line.empty()) {
      ++dropped;
    }
    begin = end + 1;
  }
  if (dropped == 0) return;
  fs::write_file_atomic(path, kept);
  log::info("{}: removed {} line(s) after step {}, which the resumed run writes again", path,
            dropped, step);
}

}  // namespace

JsonlSink::JsonlSink(const std::string& path, int64_t resumed_at) {
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) fs::create_dirs(parent);
  if (resumed_at >= 0) keep_steps_up_to(path, resumed_at);
  file_ = std::fopen(path.c_str(), resumed_at >= 0 ? "a" : "w");
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
