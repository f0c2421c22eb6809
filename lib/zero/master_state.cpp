#include "zero/master_state.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/weight_decay.h"
#include "zero/no_decay.h"

namespace dstrain::zero {

torch::Tensor gradient_coefficient(const torch::Tensor& grad_norm, double loss_scale, double clip) {
  torch::Tensor coef = torch::full_like(grad_norm, 1.0 / loss_scale);
  if (clip > 0) coef = torch::where(grad_norm > clip, coef * (clip / (grad_norm + 1e-6)), coef);
  return coef;
}

torch::Tensor squared_norm(const torch::Tensor& grad) {
  if (grad.is_cuda() && grad.scalar_type() == torch::kBFloat16) {
    const torch::Tensor norm = at::linalg_vector_norm(grad, 2, {}, false, torch::kFloat);
    return norm.to(torch::kFloat64).square().reshape({1});
  }
  // On the CPU the norm kernel sums sequentially in float32 (a relative error of 1e-5 and more
  // over millions of elements); sum() sums in cascades.
  return grad.to(torch::kFloat).pow(2).sum().to(torch::kFloat64).reshape({1});
}

torch::Tensor gradient_for_master(const torch::Tensor& grad, torch::Device device) {
  const bool as_is = grad.device() == device && (grad.scalar_type() == torch::kFloat ||
                                                 grad.scalar_type() == torch::kBFloat16);
  return as_is ? grad : grad.to(device, torch::kFloat32);
}

MasterState::MasterState(torch::Tensor master, bool aliases_params, MasterLayout layout,
                         const OptimizerFactory& make_optimizer, const EngineOptions& options,
                         comm::Communicator& comm, torch::Device device)
    : comm_(comm),
      device_(device),
      master_(std::move(master)),
      aliases_params_(aliases_params),
      layout_(std::move(layout)),
      clip_(options.gradient_clipping),
      gradient_scale_(options.gradient_scale),
      norm_group_(options.model_parallel.world ? *options.model_parallel.world : comm),
      scaler_(options.compute_dtype == torch::kHalf, options.loss_scaling) {
  const auto& group_of = options.model_parallel.group;
  const auto group = [&](const model::Placement& p) { return group_of ? group_of(p) : nullptr; };
  for (const MasterPiece& piece : layout_.owned) {
    comm::Communicator* g = piece.placement.replicated() ? group(piece.placement) : nullptr;
    owned_copies_.push_back(g ? g->world_size() : 1);
  }
  for (size_t i = 0; i < layout_.held.size(); ++i) {
    const model::Placement& placement = layout_.held[i].placement;
    comm::Communicator* g = placement.partial_gradient ? group(placement) : nullptr;
    if (g == nullptr || g->world_size() == 1) continue;
    auto it = std::find_if(partial_groups_.begin(), partial_groups_.end(),
                           [g](const auto& entry) { return entry.first == g; });
    if (it == partial_groups_.end()) it = partial_groups_.insert(it, {g, {}});
    it->second.push_back(i);
  }
  optimizer_ = make_optimizer(master_.numel(), no_decay_ranges());
  if (!optimizer_) fail(ErrorKind::kInternal, "zero engine: the optimizer factory returned null");
}

std::vector<Range> MasterState::no_decay_ranges() const {
  std::vector<Range> ranges;
  for (const MasterPiece& piece : layout_.held) {
    if (!model::takes_no_decay(piece.param, static_cast<int64_t>(piece.shape.size()))) continue;
    ranges.push_back({piece.offset, piece.offset + piece.elements.end - piece.elements.begin});
  }
  return merge_ranges(std::move(ranges));
}

void MasterState::finalize_gradients(const torch::Tensor& grad32) {
  if (gradient_scale_ != 1.0) grad32.mul_(gradient_scale_);
  for (const auto& [group, pieces] : partial_groups_) {
    std::vector<torch::Tensor> parts;
    for (size_t i : pieces) {
      const MasterPiece& piece = layout_.held[i];
      parts.push_back(grad32.narrow(0, piece.offset, piece.elements.end - piece.elements.begin));
    }
    // One collective per group, on the communicator's device (the host gradient of an offloaded
    // optimizer goes there and back).
    torch::Tensor flat = torch::cat(parts).to(device_);
    group->all_reduce(flat, comm::ReduceOp::kSum)->wait();
    int64_t at = 0;
    for (torch::Tensor& part : parts) {
      part.copy_(flat.narrow(0, at, part.numel()));
      at += part.numel();
    }
  }
}

torch::Tensor MasterState::copies_sq(const torch::Tensor& grad, int64_t offset,
                                     std::optional<Range> owned) const {
  const Range mine = owned ? Range{offset + owned->begin, offset + owned->end}
                           : Range{offset, offset + grad.numel()};
  torch::Tensor sq;
  for (size_t i = 0; i < layout_.owned.size(); ++i) {
    if (owned_copies_[i] == 1) continue;
    const MasterPiece& piece = layout_.owned[i];
    const int64_t begin = std::max(mine.begin, piece.offset);
    const int64_t end =
        std::min(mine.end, piece.offset + piece.elements.end - piece.elements.begin);
    if (!sq.defined()) sq = torch::zeros({1}, grad.options().dtype(torch::kFloat64));
    const double others = 1.0 - 1.0 / owned_copies_[i];
    if (begin < end) sq += squared_norm(grad.narrow(0, begin - offset, end - begin)) * others;
  }
  return sq;
}

StepResult MasterState::reduce_norm(const torch::Tensor& local_sq, const torch::Tensor& copies_sq) {
  StepResult result;
  result.loss_scale = scaler_.scale();
  // All-reduced on the communicator's device, where the norm and the coefficient stay: without
  // fp16 loss scaling nothing here waits for the device. With it, whether to skip the step is
  // decided on the host (one sync per step).
  torch::Tensor sq = local_sq.to(device_, torch::kFloat64).reshape({1});
  if (copies_sq.defined()) sq = (sq - copies_sq.to(device_, torch::kFloat64).reshape({1}));
  norm_group_.all_reduce(sq, comm::ReduceOp::kSum)->wait();
  result.grad_norm_tensor = sq.sqrt() / result.loss_scale;
  if (scaler_.enabled()) result.skipped = scaler_.update(!std::isfinite(sq.item<double>()));
  return result;
}

// In fp32 before the multiply: the same rounding as a host-side float coefficient. With offload it
// is read where the master lives.
torch::Tensor MasterState::coefficient(const StepResult& reduced) const {
  if (clip_ <= 0 && reduced.loss_scale == 1.0) return torch::Tensor();
  return gradient_coefficient(reduced.grad_norm_tensor, reduced.loss_scale, clip_)
      .to(master_.device(), torch::kFloat32);
}

void MasterState::update(torch::Tensor grad32, int64_t offset, const torch::Tensor& coef,
                         const torch::Tensor& compute_copy) {
  if (coef.defined()) grad32.mul_(coef);
  torch::Tensor piece = master_.narrow(0, offset, grad32.numel());
  optimizer_->update(piece, grad32, offset, compute_copy);
}

void MasterState::arm_backward_update(std::optional<double> lr) {
  backward_lr_ = can_update_during_backward() ? lr : std::nullopt;
  backward_pieces_ = 0;
  if (backward_lr_) backward_sq_ = torch::zeros({1}, master_.options().dtype(torch::kFloat64));
  backward_copies_sq_ = torch::Tensor();
}

void MasterState::backward_update(torch::Tensor grad, int64_t offset, Range owned,
                                  const torch::Tensor& compute_copy) {
  if (!backward_lr_) fail(ErrorKind::kInternal, "zero engine: backward update not armed");
  if (backward_pieces_++ == 0) begin_update(*backward_lr_);
  if (gradient_scale_ != 1.0) grad = grad.to(torch::kFloat32).mul_(gradient_scale_);
  backward_sq_ += squared_norm(grad.narrow(0, owned.begin, owned.end - owned.begin));
  const torch::Tensor sq = copies_sq(grad, offset, owned);
  if (sq.defined())
    backward_copies_sq_ = backward_copies_sq_.defined() ? backward_copies_sq_ + sq : sq;
  update(std::move(grad), offset, torch::Tensor(), compute_copy);
}

NormShare MasterState::backward_update_share(size_t pieces) {
  if (backward_pieces_ != pieces) {
    fail(ErrorKind::kInternal, "zero engine: {} of {} pieces updated during backward",
         backward_pieces_, pieces);
  }
  backward_lr_.reset();
  return {backward_sq_, backward_copies_sq_};
}

std::vector<std::string> MasterState::state_kinds() const {
  std::vector<std::string> kinds{"master"};
  for (const auto& [name, tensor] : optimizer_->state()) kinds.push_back(name);
  return kinds;
}

int64_t MasterState::optimizer_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, tensor] : optimizer_->state()) bytes += tensor.nbytes();
  return bytes;
}

std::vector<StatePiece> MasterState::owned_state() const {
  const std::map<std::string, torch::Tensor> state = optimizer_->state();
  std::vector<StatePiece> out;
  for (const MasterPiece& piece : layout_.owned) {
    const int64_t n = piece.elements.end - piece.elements.begin;
    StatePiece sp{piece.param, piece.shape, piece.elements, {}};
    sp.tensors["master"] = master_.narrow(0, piece.offset, n).view({n});
    for (const auto& [name, tensor] : state) sp.tensors[name] = tensor.narrow(0, piece.offset, n);
    out.push_back(std::move(sp));
  }
  return out;
}

void MasterState::load_state(const StateSource& source, int64_t step_count,
                             const LossScalerState& scaler) {
  torch::NoGradGuard no_grad;
  const std::vector<std::string> kinds = state_kinds();
  std::map<std::string, torch::Tensor> loaded;
  for (const std::string& kind : kinds) loaded[kind] = torch::zeros_like(master_, torch::kFloat32);
  for (const MasterPiece& piece : layout_.held) {
    const Range r = piece.elements;
    for (const std::string& kind : kinds) {
      torch::Tensor values = source(kind, piece.param, r);
      if (!values.defined() || values.numel() != r.end - r.begin) {
        fail(ErrorKind::kInput, "checkpoint state '{}' of '{}' elements [{}, {}): got {} values",
             kind, piece.param, r.begin, r.end, values.defined() ? values.numel() : 0);
      }
      loaded[kind].narrow(0, piece.offset, r.end - r.begin).copy_(values.reshape({-1}));
    }
  }
  torch::Tensor master = loaded.at("master");
  loaded.erase("master");
  optimizer_->load_state(loaded, step_count);
  master_.copy_(master);
  scaler_.load_state(scaler);
}

}  // namespace dstrain::zero
