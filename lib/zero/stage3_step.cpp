// Stage 3: the optimizer step (clipping, fp16 overflow, offloaded update), memory accounting and
// checkpoint pieces.
#include <cmath>

#include "core/error.h"
#include "model/storage.h"
#include "zero/stage3.h"

namespace dstrain::zero {

StepResult Stage3Engine::step(double lr) {
  if (micro_step_ != options_.gradient_accumulation_steps) {
    fail(ErrorKind::kInternal, "zero engine: step() after {} of {} backward() calls", micro_step_,
         options_.gradient_accumulation_steps);
  }
  torch::NoGradGuard no_grad;
  StepResult result;
  result.loss_scale = scaler_.scale();
  // The gradient shard in fp32 where the master lives (the host when offloading the optimizer).
  torch::Tensor grad32 = grad_shard_.to(master_.device(), torch::kFloat32);
  torch::Tensor sq = grad32.pow(2).sum().to(device_, torch::kFloat64).reshape({1});
  comm_.all_reduce(sq, comm::ReduceOp::kSum)->wait();
  const double total = sq.item<double>();
  result.grad_norm = std::sqrt(total) / result.loss_scale;
  result.skipped = scaler_.update(!std::isfinite(total));
  if (!result.skipped) {
    const double coef = gradient_coefficient(result, options_.gradient_clipping);
    if (coef != 1.0) grad32.mul_(coef);
    optimizer_->step(master_, grad32, lr);
    grad32 = torch::Tensor();
    refresh_params();
  }
  grad_shard_.zero_();
  micro_step_ = 0;
  return result;
}

// Master → compute-dtype parameter shard (a copy back to the device when offloading), then the
// persistent unit's all-gather. Other units are gathered when next used.
void Stage3Engine::refresh_params() {
  if (!master_aliases_params_) param_shard_.copy_(master_);
  Unit& persistent = units_[persistent_unit_];
  if (persistent.partition.padded_numel() == 0) return;
  torch::Tensor input = shard_of(persistent, param_shard_).to(device_);
  comm_.all_gather(persistent.full, input)->wait();
}

MemoryReport Stage3Engine::bytes() const {
  MemoryReport report;
  // Frozen (LoRA base) shards are parameters in the compute dtype too.
  const int64_t persistent =
      units_[persistent_unit_].full.nbytes() + units_[persistent_unit_ + 1].full.nbytes();
  report.compute_params = param_shard_.nbytes() + frozen_shard_.nbytes() + persistent;
  report.persistent_params = persistent;
  report.gradients = grad_shard_.nbytes();
  report.master_weights = master_aliases_params_ ? 0 : master_.nbytes();
  for (const auto& [name, tensor] : optimizer_->state()) report.optimizer_state += tensor.nbytes();
  report.gathered_params = gathered_bytes();
  report.gathered_params_peak = gathered_peak_;
  // What offload moves to the host (on a CPU-only machine host and device are one memory, so this
  // is counted by intent, not by the tensors' device).
  if (options_.offload_param) report.host_bytes += param_shard_.nbytes() + frozen_shard_.nbytes();
  if (options_.offload_optimizer)
    report.host_bytes += report.master_weights + report.optimizer_state + report.gradients;
  return report;
}

std::vector<std::string> Stage3Engine::state_kinds() const {
  std::vector<std::string> kinds{"master"};
  for (const auto& [name, tensor] : optimizer_->state()) kinds.push_back(name);
  return kinds;
}

int64_t Stage3Engine::step_count() const {
  return optimizer_->step_count();
}

LossScalerState Stage3Engine::loss_scaler_state() const {
  return scaler_.state();
}

std::vector<StatePiece> Stage3Engine::owned_state() const {
  const std::map<std::string, torch::Tensor> state = optimizer_->state();
  std::vector<StatePiece> out;
  for (const Unit& unit : units_) {
    if (unit.frozen) continue;
    for (const ParamPiece& piece : unit.partition.owned_pieces(comm_.rank())) {
      const NamedParameter& p = params_[unit.params[piece.param]];
      const int64_t n = piece.elements.end - piece.elements.begin;
      const int64_t offset = unit.shard_offset + piece.offset;
      StatePiece sp{p.name, p.tensor.sizes().vec(), piece.elements, {}};
      sp.tensors["master"] = master_.narrow(0, offset, n);
      for (const auto& [name, tensor] : state) sp.tensors[name] = tensor.narrow(0, offset, n);
      out.push_back(std::move(sp));
    }
  }
  return out;
}

void Stage3Engine::load_state(const StateSource& source, int64_t step_count,
                              const LossScalerState& scaler) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> loaded;
  for (const std::string& kind : state_kinds()) {
    loaded[kind] = torch::zeros({shard_numel_}, master_.options().dtype(torch::kFloat32));
  }
  for (const Unit& unit : units_) {
    if (unit.frozen) continue;
    for (const ParamPiece& piece : unit.partition.owned_pieces(comm_.rank())) {
      const std::string& name = params_[unit.params[piece.param]].name;
      const Range r = piece.elements;
      for (auto& [kind, target] : loaded) {
        torch::Tensor values = source(kind, name, r);
        if (!values.defined() || values.numel() != r.end - r.begin) {
          fail(ErrorKind::kInput, "checkpoint state '{}' of '{}' elements [{}, {}): got {} values",
               kind, name, r.begin, r.end, values.defined() ? values.numel() : 0);
        }
        target.narrow(0, unit.shard_offset + piece.offset, r.end - r.begin)
            .copy_(values.reshape({-1}));
      }
    }
  }
  torch::Tensor master = loaded.at("master");
  loaded.erase("master");
  optimizer_->load_state(loaded, step_count);
  master_.copy_(master);
  scaler_.load_state(scaler);
  refresh_params();
  grad_shard_.zero_();
  micro_step_ = 0;
}

}  // namespace dstrain::zero
