#pragma once
// ZeRO stage 3: parameters, gradients, fp32 master weights and optimizer state all partitioned.
// An Engine implementation (engine.h), built by make_engine() for EngineOptions::stage = 3, which
// validates the options. The fp32 master, the optimizer and the update are a MasterState
// (master_state.h) over this rank's shard.
//
// Units. Parameters are grouped into units by their block (NamedParameter::unit: the trainer passes
// the model's block index, lib/model/blocks.h, so the units are the blocks). Each unit has its own
// flat buffer `full` [padded numel] in the compute dtype; the parameters are views of it. A unit's
// buffer holds memory only while the unit is gathered (storage.h): rank r keeps chunk r of it
// (`param_shard_`), and before the unit is used the chunks are all-gathered into `full`.
// Parameters with fewer than `param_persistence_threshold` elements form one extra persistent unit
// that is always gathered (refreshed by one all-gather after each step), so norms and biases cost
// no gather per segment.
//
// Frozen parameters (NamedParameter::frozen: a LoRA base) form units of their own, one per caller
// unit, read by the same segments: their chunks live in a separate compute-dtype shard, they are
// gathered for forward and for backward (the input gradient needs them) and released when the
// segment's backward is over (the moment the gradient of the previous segment's output is
// complete), and they take no part in reductions, the optimizer or checkpoints.
//
// Construction. With EngineOptions::initial_values the parameters may hold no memory at all
// (model::Materialize::kNo): each rank asks for the values of its own chunks (and of the
// persistent parameters) only, so no rank ever holds the whole model. Without it, the values are
// read from the parameters, which then hold the full model on every rank.
//
// Segments. The forward pass is a fixed sequence of segments (the model's blocks: embedding, layer
// 0..L-1, head), each reading a set of units (EngineOptions::segments). The caller brackets each
// segment:
//   pre_forward(k)          gathers the units of segment k (waiting for a prefetch), then starts
//                           gathers of the following segments' units within prefetch_bucket_size
//   post_forward(k, out)    releases units the next segment does not read; with grad mode on,
//                           hooks `out` so that, in backward, the gradient of `out` arriving — the
//                           moment before segment k's backward — gathers segment k's units again
//                           and prefetches segment k-1's.
// A unit used by two segments (the tied embedding: embed and head) is gathered for each. Gradients:
// when every parameter of a unit has accumulated its gradient (post-accumulate hooks, so a tied
// weight reports once, after both uses), the gradients are copied into a transient unit-sized
// buffer, reduce-scattered (average) into this rank's gradient shard (added: micro-steps
// accumulate) and the unit is released. Collectives are issued from the autograd thread in graph
// order, identical on every rank.
//
// Communication per micro-step (Ψ elements): every unit is gathered once for forward and once for
// backward and reduce-scattered once: 3Ψ in the ring model; a unit read by two segments adds one
// gather (tied embedding: +Ψ_embed). The persistent unit: one reduce-scatter per micro-step and one
// all-gather per step. With keep_gathered_memory (CUDA graphs) a unit's gathered copy stays
// valid until its chunks change: each trainable unit is gathered once per step (Ψ), however many
// micro-steps, and each frozen unit (a LoRA base) once for the whole run.
//
// Update during backward. Without clipping and fp16 loss scaling, once the trainer has said the
// step's learning rate (Engine::set_step_lr), each unit's part of the master is updated, and copied
// into the parameter shard, as soon as its reduce-scatter completes in the last micro-step's
// backward (a reduced unit is not gathered again in that backward); step() then only all-reduces
// Σg² for the reported norm and gathers the persistent unit.
//
// Offload. offload_optimizer: master shard, optimizer state and the fp32 gradient shard live in
// host memory (pinned when CUDA is available); each unit's reduced gradient chunk is added to the
// host shard as its reduce-scatter completes, during backward; the optimizer runs there and the
// updated values are copied back into the compute-dtype parameter shard. offload_param: the
// compute-dtype parameter shard lives in host memory too and is copied to the device as the
// all-gather input. On a CPU-only build the copies are host to host, through the same code path.

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "comm/communicator.h"
#include "zero/engine.h"
#include "zero/grad_hooks.h"
#include "zero/master_state.h"

namespace dstrain::zero {

class Stage3Engine final : public Engine {
 public:
  Stage3Engine(std::vector<NamedParameter> params, comm::Communicator& comm,
               const OptimizerFactory& make_optimizer, EngineOptions options);
  ~Stage3Engine() override;

  void pre_forward(size_t segment) override;
  void post_forward(size_t segment, const torch::Tensor& output) override;

  MemoryReport bytes() const override;
  std::vector<StatePiece> owned_state() const override { return master_->owned_state(); }
  std::vector<std::string> state_kinds() const override { return master_->state_kinds(); }
  int64_t step_count() const override { return master_->step_count(); }
  LossScalerState loss_scaler_state() const override { return master_->loss_scaler_state(); }
  LossScaler& loss_scaler() override { return master_->scaler(); }

  // Internal units (Unit::Role): each block's trainable unit, then each block's frozen unit, then
  // the persistent trainable and the persistent frozen unit.
  size_t num_units() const { return units_.size(); }
  // Elements of unit `unit` (without padding).
  int64_t unit_numel(size_t unit) const { return units_[unit].partition.numel(); }
  bool unit_gathered(size_t unit) const { return units_[unit].state != UnitState::kFree; }
  bool can_update_during_backward() const override { return master_->can_update_during_backward(); }

 private:
  enum class UnitState { kFree, kGathering, kGathered };
  struct Unit {
    // What the unit holds: a block's trainable or frozen (no gradients; chunks in frozen_shard_)
    // parameters, gathered around the block's segments, or the small parameters of every block,
    // trainable or frozen, gathered for good.
    enum class Role { kBlock, kFrozenBlock, kPersistent, kPersistentFrozen };
    // The unit of `role` for block `block` (-1 for the persistent roles).
    using Key = std::pair<Role, int>;
    Unit(Key key, std::vector<size_t> members, Partition layout)
        : role(key.first),
          block(key.second),
          params(std::move(members)),
          partition(std::move(layout)) {}
    bool frozen() const { return role == Role::kFrozenBlock || role == Role::kPersistentFrozen; }
    bool persistent() const { return role == Role::kPersistent || role == Role::kPersistentFrozen; }
    Role role;
    int block;                   // NamedParameter::unit of its parameters; -1 when persistent
    std::vector<size_t> params;  // indices into params_, in flat order
    Partition partition;         // the unit's own flat layout: one bucket, N chunks
    int64_t shard_offset = 0;    // where this rank's chunk starts in the shards
    torch::Tensor full;  // [padded numel] compute dtype, on the device; storage only when gathered
    UnitState state = UnitState::kFree;
    // With keep_gathered_memory: `full` still holds what a gather would bring (the unit has been
    // gathered and its chunks have not changed since), so using it again needs no gather. Frozen
    // chunks never change; trainable ones change with every update (stale_trainable_units).
    bool current = false;
    std::unique_ptr<comm::Work> gather;
    torch::Tensor gather_input;  // the chunk sent, kept alive until the gather completes
    int waiting = 0;             // parameters whose gradient has not arrived in this backward
    bool reduced = false;        // gradients reduce-scattered in this backward
    torch::Tensor grad_full;     // transient [padded numel] while gradients arrive
  };
  struct Reduction {
    std::unique_ptr<comm::Work> work;
    torch::Tensor input, output, target;  // target += output on completion
    size_t unit = 0;
    bool update = false;  // then update the unit's part of the master (update_unit)
  };

  void before_autograd(MicroStep micro) override;
  void after_autograd() override { finish_backward(); }
  double backward_scale() const override { return master_->loss_scale(); }
  NormShare prepare_step() override;
  StepResult reduce_norm(const NormShare& share) override;
  void finish_step(const StepResult& result, double lr) override;
  void do_discard() override;
  void do_load_state(const StateSource& source, int64_t step_count,
                     const LossScalerState& scaler) override;

  void validate(const std::vector<NamedParameter>& params) const;
  void build_units(const std::vector<NamedParameter>& params);
  Unit::Key unit_key(const NamedParameter& p) const;
  torch::Tensor build_shards();
  torch::Tensor initial_values(size_t param, Range elements) const;
  MasterLayout master_layout() const;
  torch::Tensor shard_of(const Unit& unit, const torch::Tensor& shards) const;
  void launch_gather(size_t unit);
  void wait_gathered(size_t unit);
  void release(size_t unit);
  // The trainable units' chunks are about to change (an update, a loaded state): their kept
  // gathered memory no longer counts as current.
  void stale_trainable_units();
  void prefetch_after(size_t segment, int direction);
  void pre_backward(size_t segment);
  void release_frozen_after(size_t segment);
  void on_grad_ready(size_t param);
  void reduce_unit(size_t unit);
  void retire_oldest();
  void finish_backward();
  // Updates unit `unit`'s part of the master from its reduced gradient during the step's last
  // backward, and its part of the parameter shard.
  void update_unit(size_t unit);
  void refresh_params();
  void gather_persistent();
  void note_gathered();
  int64_t gathered_bytes() const;
  torch::TensorOptions compute_options() const {
    return torch::TensorOptions().dtype(options_.compute_dtype).device(device_);
  }

  comm::Communicator& comm_;
  EngineOptions options_;
  torch::Device device_;
  torch::Device host_device_;  // where offloaded state lives
  std::vector<NamedParameter> params_;
  std::vector<size_t> unit_of_;  // parameter → unit
  std::vector<Unit> units_;
  int64_t shard_numel_ = 0;            // Σ trainable units' chunks
  int64_t frozen_numel_ = 0;           // Σ frozen units' chunks
  size_t persistent_unit_ = 0;         // the trainable persistent unit
  size_t persistent_frozen_unit_ = 0;  // the frozen persistent unit
  torch::Tensor param_shard_;          // [shard_numel] compute dtype (host when offload_param)
  torch::Tensor frozen_shard_;         // [frozen_numel] compute dtype (host when offload_param)
  // [shard_numel] compute dtype on the device; fp32 on the host with offload_optimizer
  torch::Tensor grad_shard_;
  // Master over [shard_numel] fp32 (host when offload_optimizer); it is param_shard_ itself in fp32
  // when both live in the same memory.
  std::unique_ptr<MasterState> master_;
  // Between prepare_step() and finish_step(): the gradient shard in fp32 where the master lives,
  // unless the update ran during backward.
  torch::Tensor grad32_;
  std::vector<AccumulatorHandle> hooks_;
  std::deque<Reduction> in_flight_;
  bool in_backward_ = false;
  int64_t gathered_peak_ = 0;
};

}  // namespace dstrain::zero
