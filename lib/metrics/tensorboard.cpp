#include "metrics/tensorboard.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "metrics/tfrecord.h"

namespace dstrain::metrics {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

tb::SessionStatus session_status(RunStatus status) {
  return status == RunStatus::kFinished ? tb::SessionStatus::kSuccess : tb::SessionStatus::kFailure;
}

}  // namespace

std::string event_file_name(double wall_time) {
  static std::atomic<int> counter{0};
  return fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<int64_t>(wall_time),
                     host_name(), ::getpid(), counter++);
}

TensorBoardSink::TensorBoardSink(const TensorBoardOptions& options)
    : last_step_(options.start_step) {
  fs::create_dirs(options.dir);
  const double t = now_seconds();
  path_ = (std::filesystem::path(options.dir) / event_file_name(t)).string();
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) fail(ErrorKind::kIo, "cannot create TensorBoard event file {}", path_);
  const int64_t purge_from = options.start_step == 0 ? 0 : options.start_step + 1;
  std::lock_guard<std::mutex> lock(mutex_);
  append(tb::file_version_event(t));
  append(tb::session_start_event(t, purge_from));
  if (!options.config_markdown.empty()) {
    append(tb::text_event(t, options.start_step, "config", options.config_markdown));
  }
  if (!options.hparams.empty()) {
    append(tb::hparams_start_event(t, options.start_step, options.hparams, t));
  }
}

TensorBoardSink::~TensorBoardSink() {
  if (file_ != nullptr) std::fclose(file_);
}

void TensorBoardSink::append(const std::string& event) {
  const std::string frame = tfrecord_frame(event);
  const bool ok =
      std::fwrite(frame.data(), 1, frame.size(), file_) == frame.size() && std::fflush(file_) == 0;
  if (!ok && !write_failed_) {
    write_failed_ = true;  // once: a full disk must not flood the log nor stop training
    log::warn("cannot write TensorBoard event file {}; its later events may be missing", path_);
  }
}

void TensorBoardSink::write(const Record& record) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_step_ = record.step;
  append(tb::scalars_event(now_seconds(), record.step, record.values));
}

void TensorBoardSink::finish(RunStatus status, double) {
  std::lock_guard<std::mutex> lock(mutex_);
  const double t = now_seconds();
  append(tb::hparams_end_event(t, last_step_, session_status(status), t));
}

}  // namespace dstrain::metrics
