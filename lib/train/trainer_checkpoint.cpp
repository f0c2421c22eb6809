// Trainer's checkpoint save/restore and the end-of-run summary. The protocol, the file names and
// the state of each component live in lib/ckpt and the components (ckpt/stateful.h); this file
// registers the components, describes the run for the manifest, and applies checkpoint.on_error.

#include <chrono>
#include <filesystem>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "ckpt/layout.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/run_files.h"
#include "core/secrets.h"
#include "core/timer.h"
#include "core/trace.h"
#include "metrics/restarts.h"
#include "model/model.h"
#include "train/component_options.h"
#include "train/train_state.h"
#include "train/trainer.h"

namespace dstrain::train {
namespace stdfs = std::filesystem;
using nlohmann::json;

namespace {

// Tokenizer files of the model directory, carried into the checkpoint so that an export of it is
// a complete Hugging Face model directory.
void add_tokenizer_files(const std::string& from_dir,
                         std::vector<std::pair<std::string, std::string>>& files) {
  for (const char* name : ckpt::kTokenizerFiles) {
    const stdfs::path src = stdfs::path(from_dir) / name;
    if (stdfs::is_regular_file(src)) files.emplace_back(name, fs::read_file(src));
  }
}

}  // namespace

void Trainer::create_checkpointer() {
  ckpt::CheckpointerOptions o;
  o.dir = cfg_.checkpoint.dir;
  o.rank = rank_;
  o.world_size = world_;
  o.keep_last = cfg_.checkpoint.keep_last;
  o.async = cfg_.checkpoint.async;
  o.max_writers_per_node = static_cast<int>(cfg_.checkpoint.max_writers_per_node);
  checkpointer_ = std::make_unique<ckpt::Checkpointer>(o, [this] { comm_->barrier(); });
  // Restored in this order: the LoRA base reference first, so that a checkpoint of another base
  // is refused for that reason before anything else is compared.
  if (parallel_.lora) {
    lora_reference_ = std::make_unique<LoraReference>(lora_reference_json());
    checkpointer_->add("lora", lora_reference_.get());
  }
  progress_state_ =
      std::make_unique<ProgressState>(step_, tokens_seen_, last_loss_, micro_batch_record());
  // The engine's pieces in the whole model's coordinates, by each parameter's placement.
  engine_state_ = std::make_unique<WholeCoordinateState>(
      *parallel_.engine, *parallel_.model, parallel_.lora.get(), *parallel_.tensor_parallel);
  checkpointer_->add("engine", engine_state_.get());
  checkpointer_->add("loss_scaler", &parallel_.engine->loss_scaler());
  checkpointer_->add("loader", loader_.get());
  checkpointer_->add("progress", progress_state_.get());
}

void Trainer::save_checkpoint() {
  const trace::Span span("checkpoint", "checkpoint save", {"step", step_});
  Stopwatch stall;
  ckpt::Manifest run;
  std::vector<std::pair<std::string, std::string>> files;
  if (rank_ == 0) {
    run.zero_stage = cfg_.zero.stage;
    run.compute_dtype = model::dtype_name(compute_dtype(cfg_));
    run.model_name_or_path = cfg_.model.name_or_path;
    run.model_dir = model_dir_;
    run.tokenizer = cfg_.model.tokenizer;
    run.config_yaml = config::to_yaml(cfg_);
    run.train_loss = last_loss_;
    run.created_unix =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    files.emplace_back(ckpt::kRunConfigFile, run.config_yaml);
    files.emplace_back(ckpt::kModelConfigFile, model::to_json(model_config_).dump(2) + "\n");
    if (cfg_.model.tokenizer.empty()) add_tokenizer_files(model_dir_, files);
  }
  checkpointer_->save(step_, std::move(run), std::move(files));
  ckpt_stats_.stall_s += stall.seconds();
  if (!cfg_.checkpoint.async) report_saves();
}

void Trainer::report_saves() {
  for (const ckpt::SaveResult& r : checkpointer_->take_finished()) {
    ckpt_stats_.saves += 1;
    ckpt_stats_.write_s += r.write_s;
    ckpt_stats_.bytes += r.bytes;
    if (r.ok) {
      last_checkpoint_ = r.tag_dir;
      log::info("checkpoint {} {}: shard {:.1f} MB, snapshot {:.3f} s, written in {:.2f} s",
                r.tag_dir, rank_ == 0 ? "committed" : "written", static_cast<double>(r.bytes) / 1e6,
                r.snapshot_s, r.write_s);
      continue;
    }
    ckpt_stats_.failed += 1;
    if (cfg_.checkpoint.on_error == "continue") {
      log::warn(
          "checkpoint at step {} failed: {}; `latest` still names the previous checkpoint "
          "(checkpoint.on_error: continue)",
          r.step, r.error);
      continue;
    }
    fail(ErrorKind::kIo,
         "checkpoint at step {} failed: {}; `latest` still names the previous checkpoint "
         "(checkpoint.on_error: stop)",
         r.step, r.error);
  }
}

void Trainer::finish_saves() {
  checkpointer_->wait();
  report_saves();
}

void Trainer::restore(const std::string& tag_dir) {
  const ckpt::Manifest m = checkpointer_->restore(tag_dir);
  last_checkpoint_ = tag_dir;
  log::info("resumed from {} at step {} (saved by {} rank(s) at zero stage {})", tag_dir, step_,
            m.world_size, m.zero_stage);
}

void Trainer::write_summary(const RunSummary& s) {
  json j = {
      {"status", s.preempted ? "preempted" : "completed"},
      {"steps", s.steps},
      {"tokens", s.tokens},
      {"train_loss", s.train_loss},
      {"seconds", s.seconds},
      {"tokens_per_s", s.seconds > 0 ? static_cast<double>(s.tokens_this_run) / s.seconds : 0.0},
      {"checkpoint", s.checkpoint},
      {"checkpoint_saves", ckpt_stats_.saves},
      {"checkpoint_failures", ckpt_stats_.failed},
      {"checkpoint_stall_s", ckpt_stats_.stall_s},
      {"checkpoint_write_s", ckpt_stats_.write_s},
      {"world_size", world_},
      {"config", secrets::redact(cfg_.source_path)}};
  if (s.eval_loss >= 0) {
    j["eval_loss"] = s.eval_loss;
    j["eval_ppl"] = std::exp(s.eval_loss);
  }
  // The launcher's restarts of this run (--max-restarts), so that the summary tells the whole run.
  const auto restarts = metrics::read_restarts(run_files::restarts_file(cfg_.logging.out_dir));
  j["restarts"] = restarts.size();
  if (!restarts.empty()) j["restart_causes"] = metrics::to_json(restarts);
  fs::write_file_atomic(run_files::summary_file(cfg_.logging.out_dir), j.dump(2) + "\n");
}

}  // namespace dstrain::train
