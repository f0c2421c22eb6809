// Engine: memory accounting and checkpoint pieces.
#include "core/error.h"
#include "zero/engine.h"
#include "zero/grad_reducer.h"
#include "zero/stage3.h"

namespace dstrain::zero {

MemoryReport Engine::bytes() const {
  if (stage3_) return stage3_->bytes();
  MemoryReport report;
  report.compute_params = flat_params_.nbytes();
  if (flat_grad_.defined()) report.gradients += flat_grad_.nbytes();
  if (grad_shard_.defined()) report.gradients += grad_shard_.nbytes();
  report.master_weights = master_aliases_params_ ? 0 : master_.nbytes();
  for (const auto& [name, tensor] : optimizer_->state()) report.optimizer_state += tensor.nbytes();
  report.comm_buffers = reducer_->held_bytes();
  report.comm_buffers_peak = reducer_->peak_bytes();
  // Counted by intent, as at stage 3: on a CPU-only machine host and device are one memory.
  if (options_.offload_optimizer) {
    report.host_bytes = report.master_weights + report.optimizer_state;
    if (grad_shard_.defined()) report.host_bytes += grad_shard_.nbytes();  // fp32 on the host
  }
  return report;
}

std::vector<std::string> Engine::state_kinds() const {
  if (stage3_) return stage3_->state_kinds();
  std::vector<std::string> kinds{"master"};
  for (const auto& [name, tensor] : optimizer_->state()) kinds.push_back(name);
  return kinds;
}

int64_t Engine::step_count() const {
  if (stage3_) return stage3_->step_count();
  return optimizer_->step_count();
}

LossScalerState Engine::loss_scaler_state() const {
  if (stage3_) return stage3_->loss_scaler_state();
  return scaler_.state();
}

std::vector<StatePiece> Engine::owned_state() const {
  if (stage3_) return stage3_->owned_state();
  const std::map<std::string, torch::Tensor> state = optimizer_->state();
  std::vector<StatePiece> out;
  for (const ParamPiece& piece : partition_.owned_pieces(comm_.rank())) {
    const ParamInfo& p = params_[piece.param];
    const int64_t n = piece.elements.end - piece.elements.begin;
    // At stage 0 master_ and the state span the whole flat buffer: find the piece at its flat
    // offset.
    const int64_t offset = options_.stage == 0
                               ? partition_.param_offset(piece.param) + piece.elements.begin
                               : piece.offset;
    StatePiece sp{p.name, p.shape, piece.elements, {}};
    sp.tensors["master"] = master_.narrow(0, offset, n).view({n});
    for (const auto& [name, tensor] : state) sp.tensors[name] = tensor.narrow(0, offset, n);
    out.push_back(std::move(sp));
  }
  return out;
}

void Engine::load_state(const StateSource& source, int64_t step_count,
                        const LossScalerState& scaler) {
  if (stage3_) return stage3_->load_state(source, step_count, scaler);
  torch::NoGradGuard no_grad;
  const std::vector<std::string> kinds = state_kinds();
  std::map<std::string, torch::Tensor> loaded;
  for (const std::string& kind : kinds) loaded[kind] = torch::zeros_like(master_, torch::kFloat32);
  for (const ParamPiece& piece : master_pieces()) {
    const ParamInfo& p = params_[piece.param];
    const int64_t n = piece.elements.end - piece.elements.begin;
    for (const std::string& kind : kinds) {
      torch::Tensor values = source(kind, p.name, piece.elements);
      if (!values.defined() || values.numel() != n) {
        fail(ErrorKind::kInput, "checkpoint state '{}' of '{}' elements [{}, {}): got {} values",
             kind, p.name, piece.elements.begin, piece.elements.end,
             values.defined() ? values.numel() : 0);
      }
      loaded[kind].narrow(0, master_offset(piece), n).copy_(values.reshape({-1}));
    }
  }
  torch::Tensor master = loaded.at("master");
  loaded.erase("master");
  optimizer_->load_state(loaded, step_count);
  master_.copy_(master);
  scaler_.load_state(scaler);
  refresh_params();
  zero_grad();
  micro_step_ = 0;
}

}  // namespace dstrain::zero
