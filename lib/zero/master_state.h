#pragma once
// The part of training state both engines share: the fp32 master weights this rank updates, the
// optimizer over them, the fp16 loss scaler, global-norm clipping and the update itself, and the
// checkpoint pieces of master and optimizer state. Internal to the engine (engine.h).
//
// An implementation lays out its master tensor as it likes (stage 0: the whole flat buffer; stages
// 1/2: the rank's chunks of every bucket; stage 3: the rank's chunks of every unit) and describes
// it as pieces: which elements of which parameter sit where in the master. From those pieces this
// class finds the no-decay ranges, names the checkpoint state and loads it back. What stays with
// the implementation is getting the gradient into master coordinates (its communication) and
// getting the updated master back into the compute parameters.
//
// The step. Given the reduced gradient in master coordinates (fp32, where the master lives), whose
// partial pieces finalize_gradients() has summed over their groups, and this rank's Σg² over
// the elements it owns (each element counted once across the engine's ranks), reduce_norm()
// all-reduces
// Σg² (fp64, on the compute device; over the whole job with model parallelism, a replicated
// piece's share divided among its copies: EngineOptions::model_parallel), reports the unscaled
// global norm as a device tensor, lets the loss scaler see a non-finite sum as an fp16 overflow
// (every rank gets the same verdict through the all-reduce, so all skip together; the only host
// sync, fp16 only), and otherwise multiplies the gradient by gradient_coefficient() and runs the
// optimizer on the master.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "comm/communicator.h"
#include "model/placement.h"
#include "zero/engine.h"
#include "zero/loss_scaler.h"

namespace dstrain::zero {

// Elements [elements.begin, elements.end) of the flattened parameter `param` (full shape `shape`),
// found at `offset` in the master tensor.
struct MasterPiece {
  std::string param;
  std::vector<int64_t> shape;
  Range elements;
  int64_t offset = 0;
  // Its parameter's placement across the model-parallel ranks (NamedParameter::placement).
  model::Placement placement{};
};

struct MasterLayout {
  std::vector<MasterPiece> held;   // every piece the master holds (stage 0: the whole model)
  std::vector<MasterPiece> owned;  // those this rank saves: its partition, once across ranks
};

// The factor the summed fp32 gradient is multiplied by before the update: 1/loss_scale, times
// clip/(norm + 1e-6) when `clip` > 0 and the (unscaled) global norm `grad_norm` exceeds it;
// computed where `grad_norm` is (no host sync).
torch::Tensor gradient_coefficient(const torch::Tensor& grad_norm, double loss_scale, double clip);

// Σ g² of a float32 or bfloat16 gradient as a float64 [1] tensor where g is, accumulated in
// float32; a bfloat16 gradient on a GPU in one reduction that reads it as it is (no float32 copy).
torch::Tensor squared_norm(const torch::Tensor& grad);

// A reduced gradient as the optimizer takes it on `device`: the tensor itself when it is there
// already in float32 or bfloat16 (read exactly, no copy), else a float32 copy there (e.g. on the
// host for an offloaded optimizer).
torch::Tensor gradient_for_master(const torch::Tensor& grad, torch::Device device);

class MasterState {
 public:
  // `master`: the fp32 master [numel], already holding the initial values. `aliases_params`: it is
  // the compute parameter buffer itself (fp32 compute, same memory), so it costs no bytes of its
  // own. `device`: the compute device, where Σg² is all-reduced. Builds the optimizer for the
  // master's numel with the no-decay ranges of `layout.held`.
  MasterState(torch::Tensor master, bool aliases_params, MasterLayout layout,
              const OptimizerFactory& make_optimizer, const EngineOptions& options,
              comm::Communicator& comm, torch::Device device);

  const torch::Tensor& master() const { return master_; }
  bool aliases_params() const { return aliases_params_; }
  double loss_scale() const { return scaler_.scale(); }

  // Collective: multiplies `grad32` by EngineOptions::gradient_scale, then sums the pieces whose
  // gradient is partial (Placement::partial_gradient) over their placement's group, one
  // all-reduce per group (none without such pieces). `grad32`: the reduced gradient in master
  // coordinates (the master's elements [0, grad32.numel())), fp32, where the master lives. Before
  // its Σg² is taken.
  void finalize_gradients(const torch::Tensor& grad32);
  // Whether set_step_lr() may move the update into backward: no update waits for the norm nor for
  // the sum of a partial gradient.
  bool can_update_during_backward() const { return no_norm_needed() && partial_groups_.empty(); }

  // The step in pieces, for an engine that updates bucket by bucket:
  //   reduce_norm(local_sq)           collective: the global norm and the fp16 verdict (skipped)
  //   begin_update(lr)                once, unless skipped
  //   update(grad32, offset, coef[, compute_copy])
  //                                   for pieces that cover the master once, in any order: the
  //                                   master's elements [offset, offset + grad32.numel()) from
  //                                   their fp32 gradient (scaled by `coef` in place); a defined
  //                                   compute_copy (bf16) receives the updated piece
  //                                   (Optimizer::update)
  // with coef = coefficient(reduce_norm's result). When no_norm_needed() the coefficient is 1
  // whatever the norm, so begin_update() and update() (with an undefined coef) may come first,
  // while the other pieces' gradients are still being computed, and reduce_norm() only reports.
  bool no_norm_needed() const { return clip_ == 0 && !scaler_.enabled(); }
  // `copies_sq`: the part of local_sq that other ranks count too (copies_sq()); undefined: none.
  StepResult reduce_norm(const torch::Tensor& local_sq,
                         const torch::Tensor& copies_sq = torch::Tensor());
  // Of Σg² over the owned pieces in `grad`, which holds the master's elements [offset, offset +
  // grad.numel()) of which elements `owned` (relative to grad) are this rank's (all when absent),
  // the share the other copies of replicated pieces count: (n − 1)/n of each such piece's Σg²
  // when n ranks of the model-parallel job hold it whole. Undefined when no piece has copies.
  torch::Tensor copies_sq(const torch::Tensor& grad, int64_t offset = 0,
                          std::optional<Range> owned = std::nullopt) const;
  // fp32, one element where the master lives; undefined when it is 1.
  torch::Tensor coefficient(const StepResult& reduced) const;
  void begin_update(double lr) { optimizer_->begin_step(lr); }
  void update(torch::Tensor grad32, int64_t offset, const torch::Tensor& coef,
              const torch::Tensor& compute_copy = torch::Tensor());

  // The same pieces during the step's last backward, for both engines:
  //   arm_backward_update(lr)         before that backward: armed when `lr` is set and
  //                                   no_norm_needed(), else disarmed
  //   backward_update(grad, offset, owned[, compute_copy])
  //                                   each piece as its gradient is reduced (gradient_for_master:
  //                                   float32 or bfloat16, multiplied by gradient_scale): the first
  //                                   begins the update; Σg² of `owned` (the elements of grad this
  //                                   rank owns) is added up for the reported norm
  //   backward_update_share(pieces)   in step(): Error(kInternal) unless `pieces` pieces came,
  //                                   then their share of the norm, for reduce_norm(); disarms
  void arm_backward_update(std::optional<double> lr);
  bool backward_update_armed() const { return backward_lr_.has_value(); }
  void backward_update(torch::Tensor grad, int64_t offset, Range owned,
                       const torch::Tensor& compute_copy = torch::Tensor());
  NormShare backward_update_share(size_t pieces);

  std::vector<StatePiece> owned_state() const;
  std::vector<std::string> state_kinds() const;  // "master", then the optimizer's names
  int64_t step_count() const { return optimizer_->step_count(); }
  LossScalerState loss_scaler_state() const { return scaler_.state(); }
  LossScaler& scaler() { return scaler_; }
  // Fills the master and the optimizer state with `source`'s values of every held piece (Error
  // (kInput) when one is missing), and the scaler with `scaler`. The caller then refreshes its
  // parameters.
  void load_state(const StateSource& source, int64_t step_count, const LossScalerState& scaler);

  int64_t master_bytes() const { return aliases_params_ ? 0 : master_.nbytes(); }
  int64_t optimizer_bytes() const;

 private:
  std::vector<Range> no_decay_ranges() const;

  comm::Communicator& comm_;
  torch::Device device_;
  torch::Tensor master_;  // [numel] fp32 (host memory with offload_optimizer)
  bool aliases_params_;
  MasterLayout layout_;
  double clip_;
  double gradient_scale_;
  // Where the norm is summed: the whole job with model parallelism, else `comm_`.
  comm::Communicator& norm_group_;
  // How many ranks hold each piece of layout_.owned whole (1: this rank only, among the parts).
  std::vector<int> owned_copies_;
  // The held pieces with a partial gradient, by the group they are summed over, in held order.
  std::vector<std::pair<comm::Communicator*, std::vector<size_t>>> partial_groups_;
  LossScaler scaler_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  // The update during backward: its learning rate while armed, the pieces updated so far and
  // their Σg² (fp64, where the master lives).
  std::optional<double> backward_lr_;
  size_t backward_pieces_ = 0;
  torch::Tensor backward_sq_;
  torch::Tensor backward_copies_sq_;
};

}  // namespace dstrain::zero
