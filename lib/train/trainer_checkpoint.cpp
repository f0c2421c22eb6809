// Trainer's checkpoint save/restore and the end-of-run summary. File names and the save protocol
// live in lib/ckpt; this file only maps the engine's and the loader's state onto it.

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "ckpt/layout.h"
#include "ckpt/shards.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/trace.h"
#include "model/model.h"
#include "train/component_options.h"
#include "train/trainer.h"

namespace dstrain::train {
namespace stdfs = std::filesystem;
using nlohmann::json;

namespace {

torch::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::vector<ckpt::Piece> engine_pieces(const zero::Engine& engine) {
  std::vector<ckpt::Piece> pieces;
  for (const auto& sp : engine.owned_state()) {
    for (const auto& [kind, t] : sp.tensors) {
      pieces.push_back({kind, sp.param, sp.shape, sp.elements.begin, sp.elements.end, t});
    }
  }
  return pieces;
}

void copy_tokenizer_files(const std::string& from_dir, const stdfs::path& to_dir) {
  for (const char* name : ckpt::kTokenizerFiles) {
    const stdfs::path src = stdfs::path(from_dir) / name;
    if (stdfs::is_regular_file(src)) fs::write_file_atomic(to_dir / name, fs::read_file(src));
  }
}

}  // namespace

std::string Trainer::save_checkpoint() {
  const trace::Span span("checkpoint", "checkpoint save", {"step", step_});
  const std::string& dir = cfg_.checkpoint.dir;
  const std::string tag = ckpt::tag_for_step(step_);
  const stdfs::path tag_dir = stdfs::path(dir) / tag;
  comm_->barrier();
  if (rank_ == 0) {
    std::error_code ec;
    // The directory may hold an older run's checkpoint of the same step. If `latest` names it,
    // point `latest` at the newest other complete checkpoint (or drop it) before deleting, so that
    // `latest` never names an incomplete checkpoint, even if this save is interrupted.
    if (ckpt::read_latest(dir) == tag) {
      auto tags = ckpt::list_complete_tags(dir);
      tags.erase(std::remove(tags.begin(), tags.end(), tag), tags.end());
      if (tags.empty()) {
        stdfs::remove(stdfs::path(dir) / ckpt::kLatestFile, ec);
      } else {
        ckpt::write_latest(dir, tags.back());
      }
    }
    stdfs::remove_all(tag_dir, ec);  // leftovers of a crashed save, or an older run's checkpoint
    fs::create_dirs(tag_dir);
  }
  comm_->barrier();
  ckpt::write_shard(tag_dir.string(), rank_, engine_pieces(*engine_),
                    {{"rng_cpu", cpu_rng_state()}}, json{{"rank", rank_}});
  comm_->barrier();
  if (rank_ == 0) {
    fs::write_file_atomic(tag_dir / ckpt::kRunConfigFile, config::to_yaml(cfg_));
    fs::write_file_atomic(tag_dir / ckpt::kModelConfigFile,
                          model::to_json(model_config_).dump(2) + "\n");
    if (cfg_.model.tokenizer.empty()) copy_tokenizer_files(model_dir_, tag_dir);
    const auto ls = engine_->loss_scaler_state();
    json manifest = {{"step", step_},
                     {"tokens_seen", tokens_seen_},
                     {"zero_stage", cfg_.zero.stage},
                     {"compute_dtype", model::dtype_name(compute_dtype(cfg_))},
                     {"loader", json::parse(data::loader_state_to_json(loader_->state()))},
                     {"optimizer_steps", engine_->step_count()},
                     {"loss_scaler",
                      {{"scale", ls.scale},
                       {"good_steps", ls.good_steps},
                       {"hysteresis_left", ls.hysteresis_left}}},
                     {"model", {{"name_or_path", cfg_.model.name_or_path}, {"dir", model_dir_}}},
                     {"tokenizer", cfg_.model.tokenizer},
                     {"config", config::to_yaml(cfg_)},
                     {"train_loss", last_loss_},
                     {"created_unix", std::chrono::duration<double>(
                                          std::chrono::system_clock::now().time_since_epoch())
                                          .count()}};
    add_lora_manifest(manifest);
    ckpt::finalize(dir, tag, world_, manifest, cfg_.checkpoint.keep_last);
  }
  comm_->barrier();
  log::info("checkpoint saved: {}", tag_dir.string());
  return tag_dir.string();
}

void Trainer::restore(const std::string& tag_dir) {
  ckpt::CheckpointReader reader(tag_dir);
  const json& m = reader.manifest();
  check_lora_checkpoint(m, tag_dir);
  // Same architecture: every parameter present with the same shape.
  std::map<std::string, std::vector<int64_t>> saved;
  for (auto& [name, shape] : reader.params("master")) saved[name] = shape;
  for (const auto& p : trainable_parameters()) {
    const auto it = saved.find(p.name);
    if (it == saved.end() || it->second != p.tensor.sizes().vec()) {
      fail(ErrorKind::kInput, "checkpoint {} does not match the model: parameter {} is {} there",
           tag_dir, p.name, it == saved.end() ? "missing" : "of another shape");
    }
  }
  zero::LossScalerState ls;
  ls.scale = m.at("loss_scaler").at("scale").get<double>();
  ls.good_steps = m.at("loss_scaler").at("good_steps").get<int64_t>();
  ls.hysteresis_left = m.at("loss_scaler").at("hysteresis_left").get<int>();
  engine_->load_state([&reader](const std::string& kind, const std::string& param,
                                zero::Range r) { return reader.read(kind, param, r.begin, r.end); },
                      m.at("optimizer_steps").get<int64_t>(), ls);

  data::LoaderState st =
      data::loader_state_from_json(m.at("loader").dump(), tag_dir + "/manifest.json");
  if (st.global_batch != loader_->global_batch()) {
    // Another world size (or batch): continue the epoch at the step that has seen as many samples.
    const int64_t seen = st.step * st.global_batch;
    log::warn("global batch changed from {} to {}: continuing epoch {} after {} samples",
              st.global_batch, loader_->global_batch(), st.epoch, seen);
    st.step = seen / loader_->global_batch();
    st.micro_step = 0;
    st.global_batch = loader_->global_batch();
  }
  loader_->restore(st);
  if (rank_ < reader.world_size()) {
    const torch::Tensor rng = reader.read_extra(rank_, "rng_cpu");
    if (rng.defined()) set_cpu_rng_state(rng);
  }
  step_ = m.at("step").get<int64_t>();
  tokens_seen_ = m.at("tokens_seen").get<int64_t>();
  last_checkpoint_ = tag_dir;
  log::info("resumed from {} at step {} (saved by {} rank(s) at zero stage {})", tag_dir, step_,
            reader.world_size(), m.at("zero_stage").get<int>());
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
      {"world_size", world_},
      {"config", cfg_.source_path}};
  if (s.eval_loss >= 0) {
    j["eval_loss"] = s.eval_loss;
    j["eval_ppl"] = std::exp(s.eval_loss);
  }
  fs::write_file_atomic(stdfs::path(cfg_.logging.out_dir) / "summary.json", j.dump(2) + "\n");
}

}  // namespace dstrain::train
