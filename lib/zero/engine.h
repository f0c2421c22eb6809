#pragma once
// The ZeRO data-parallel engine as the trainer sees it: it owns the trainable parameters' buffers,
// their gradients, the fp32 master weights and the optimizer, and does the data-parallel
// communication of ZeRO stages 0 to 3.
//
//   stage 0  gradients all-reduced (average) in buckets; every rank keeps the full fp32 master and
//            optimizer state and runs the same update (data parallel).
//   stage 1  optimizer state and master weights sharded: gradients reduce-scattered into this
//            rank's shard on the last micro-step, each rank updates its shard, parameters are
//            all-gathered afterwards.
//   stage 2  as stage 1, and gradients sharded too: buckets are reduce-scattered during backward as
//            they fill, on every micro-step, accumulating in the shard; no full-size gradient
//            buffer.
//   stage 3  parameters sharded too: gathered unit by unit around their forward and backward.
//
// Structure: `Engine` is this interface; make_engine() picks the implementation from the stage (the
// one place that looks at the stage to choose):
//   ShardedEngine (sharded_engine.h)  stages 0-2: one flat buffer cut into buckets, GradReducer
//   Stage3Engine  (stage3_engine.h)   stage 3: units gathered around forward segments
//   GroupedEngine (grouped_engine.h)  one of those per group of ranks the parameters shard over
//                                     (EngineOptions::shard_group: expert parallelism)
// Both hold a MasterState (master_state.h): the sharded fp32 master, the optimizer, the loss
// scaler, clipping and the update, and the checkpoint pieces. Ownership, buckets and padding:
// partition.h. Communication during backward: grad_reducer.h.
//
// Use, per optimizer step of A micro-steps (gradient accumulation):
//   engine->set_step_lr(lr);           // optional: lets the update start during backward
//   for (int i = 0; i < A; ++i) engine->backward(model_loss(micro_batch[i]), {i, A});
//   StepResult r = engine->step(lr);   // zero_grad is part of step()
// `loss` is this rank's mean loss over its micro-batch; backward scales it by 1/A (and the fp16
// loss scale); gradients are averaged over ranks, so equal micro-batches give the global-batch
// mean. The caller says which micro-step each backward is (the trainer takes it from data::Batch);
// the engine does not count them, it only refuses them out of order.
//
// Parameters are passed in forward order (as named_parameters() lists them). Construction replaces
// each parameter's storage by a view into an engine buffer (in the compute dtype), so the model
// keeps using the same tensors. Every call that communicates is collective: all ranks call
// backward/step/load_state in the same order. Not thread-safe. Gradient hooks run on the autograd
// thread; backward must go through this engine, not loss.backward().
//
// offload_optimizer (stages 1-3): the master shard and the optimizer state live in host memory
// (pinned with CUDA parameters) and the update runs there. offload_param (stage 3): the parameter
// shard lives in host memory too. MemoryReport::host_bytes counts what offload moves.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "ckpt/stateful.h"
#include "comm/communicator.h"
#include "model/placement.h"
#include "optim/optimizer.h"
#include "zero/loss_scaler.h"
#include "zero/partition.h"

namespace dstrain::zero {

struct NamedParameter {
  std::string name;
  torch::Tensor tensor;  // a leaf that requires grad (unless frozen); all on one device
  int unit = 0;          // stage 3: the unit it is gathered with (the trainer: the model's block)
  // A parameter that is not trained (a LoRA base weight): no gradient, master copy or optimizer
  // state, not in the checkpoint state. It gets its initial values in the compute dtype; stage 3
  // shards and gathers it like the others.
  bool frozen = false;
  // Where it lives across the model-parallel ranks (EngineOptions::model_parallel): a replicated
  // parameter is whole on every rank of its group and counts once in the gradient norm.
  model::Placement placement{};
};

// Builds the optimizer for a master shard of `shard_numel` fp32 elements; `no_decay` are the shard
// ranges of norms and biases (see model/weight_decay.h).
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(
    int64_t shard_numel, std::vector<optim::Range> no_decay)>;

// Initial values of parameter `name`: its flattened elements [begin, end) as a 1-D tensor of any
// float dtype. Lets an engine build its buffers (stage 3: only its shards) from files or a seeded
// initialisation while the parameters themselves hold no memory (model::Materialize::kNo).
using InitialValues =
    std::function<torch::Tensor(const std::string& name, int64_t begin, int64_t end)>;

struct EngineOptions {
  int stage = 0;                            // 0, 1, 2 or 3
  int64_t reduce_bucket_size = 50'000'000;  // elements per communication bucket (stages 0-2)
  bool overlap_comm = true;                 // launch buckets during backward as they fill
  bool contiguous_gradients = true;         // stage 2: copy grads into buckets as they arrive
  double gradient_clipping = 0.0;           // max global L2 norm; 0 disables
  torch::ScalarType compute_dtype = torch::kFloat32;  // kFloat32, kBFloat16 or kHalf
  LossScalingOptions loss_scaling;                    // used only with kHalf
  // Stage 3 (see stage3_engine.h). `segments[k]`: the units forward segment k reads, in forward
  // order; empty: one segment per unit, in unit order.
  std::vector<std::vector<int>> segments;
  int64_t prefetch_bucket_size = 50'000'000;      // elements gathered ahead of use
  int64_t param_persistence_threshold = 100'000;  // smaller parameters stay gathered
  // Stage 3: a unit keeps its gathered memory once it has some (released units are re-gathered
  // into the same addresses), for CUDA graphs that read parameters where they were recorded. The
  // model then holds every unit's gathered size in the compute dtype after the first step.
  bool keep_gathered_memory = false;
  bool offload_optimizer = false;  // stages 1-3: master, optimizer state and the update on the host
  bool offload_param = false;      // stage 3: parameter shards on the host
  // Where each parameter is sharded and its gradient averaged (ZeRO's data-parallel ranks), by its
  // placement: a communicator other than the engine's, and a factor the averaged gradient is
  // multiplied by (expert parallelism: a MoE layer's expert stacks over the expert-data-parallel
  // ranks, their average times ED/(D·S), Megatron-LM's expert gradient scaling, so that an
  // expert's gradient is the mean over the same D·S ranks as every other parameter's). Unset, or
  // a null communicator for a placement: the engine's communicator and 1. make_engine() builds
  // one engine per group and a GroupedEngine over them (grouped_engine.h).
  struct ShardGroup {
    comm::Communicator* comm = nullptr;
    double gradient_scale = 1.0;
  };
  std::function<ShardGroup(const model::Placement&)> shard_group;
  // The factor of this engine's gradients (set by make_engine from shard_group).
  double gradient_scale = 1.0;
  // Model parallelism (layout/parallel_layout.h): the engine's ranks hold one part of the model
  // (a pipeline stage, a tensor slice), each parameter placed as NamedParameter::placement says.
  struct ModelParallel {
    // Every rank of the job: the global norm (clipping, the fp16 verdict that skips a step) sums
    // each rank's Σg² over it, an element held whole by the n ranks of its placement's group
    // counting 1/n on each. Null: the engine's ranks hold the whole model (the norm sums over
    // them), and a model without anything to train is refused.
    comm::Communicator* world = nullptr;
    // The group a placement is cut over: the ranks holding a split parameter's other slices, or
    // each a whole copy of a replicated one. A replicated parameter's partial gradient
    // (Placement::partial_gradient) is summed over it once per step, after the data-parallel
    // reduction (Megatron-LM's finalize_model_grads). Unset, or null for a placement: a group of
    // one rank.
    std::function<comm::Communicator*(const model::Placement&)> group;
  };
  ModelParallel model_parallel;
  // Where the initial values come from; unset: from the parameters themselves (which must then
  // hold them). The master is built from them (so compute-dtype rounding never reaches it), then
  // the compute-dtype parameters. At stage 3 each rank asks only for its own shard's elements and
  // the persistent (small) parameters; at stages 0-2 for every parameter, once: the master and the
  // compute copy are both filled from that read.
  InitialValues initial_values;
};

// Elements `r` of `p`'s initial values, flattened (1-D, any float dtype): from `source` when set,
// else from the parameter itself. Error(kInternal) when the source gives another count.
torch::Tensor initial_elements(const NamedParameter& p, const InitialValues& source, Range r);

// Which micro-step of an optimizer step a backward() is: micro-step `index` of `count` (the
// gradient accumulation steps). The default is a whole step in one micro-step.
struct MicroStep {
  int64_t index = 0;
  int64_t count = 1;
  bool first() const { return index == 0; }
  bool last() const { return index + 1 == count; }
};

struct StepResult {
  // The global L2 norm of the averaged, unscaled gradient, before clipping: one fp64 element on the
  // compute device, so that a step needs no host sync; grad_norm() reads it (a sync: log steps).
  torch::Tensor grad_norm_tensor;
  double loss_scale = 1;  // loss scale this step's gradients were computed with
  bool skipped = false;   // fp16 overflow: no update was made
  double grad_norm() const {
    return grad_norm_tensor.defined() ? grad_norm_tensor.item<double>() : 0.0;
  }
};

// Bytes of the tensors the engine holds now, by category.
struct MemoryReport {
  int64_t compute_params = 0;        // flat parameter buffer (compute dtype)
  int64_t gradients = 0;             // flat gradient buffer or gradient shard (compute dtype)
  int64_t master_weights = 0;        // fp32 master (0 when it aliases the parameter buffer)
  int64_t optimizer_state = 0;       // the optimizer's state tensors
  int64_t comm_buffers = 0;          // transient bucket buffers held now (0 between steps)
  int64_t comm_buffers_peak = 0;     // most transient bucket bytes ever held at once
  int64_t gathered_params = 0;       // stage 3: gathered unit buffers held now (transient)
  int64_t gathered_params_peak = 0;  // stage 3: most gathered bytes ever held at once
  int64_t persistent_params = 0;     // stage 3: part of compute_params kept gathered for good
  int64_t host_bytes = 0;            // part of model_states() held in host memory (offload)
  int64_t model_states() const {
    return compute_params + gradients + master_weights + optimizer_state;
  }
  int64_t device_model_states() const { return model_states() - host_bytes; }
};

// One piece of fp32 training state this rank owns: elements [elements.begin, elements.end) of the
// flattened parameter `param` of full shape `shape`. `tensors` maps each state kind ("master", then
// the optimizer's names, e.g. "exp_avg", "exp_avg_sq") to a 1-D fp32 view of the engine's live
// state, numel = elements.end - elements.begin. Views: copy before the next step() if kept.
struct StatePiece {
  std::string param;
  std::vector<int64_t> shape;
  Range elements;
  std::map<std::string, torch::Tensor> tensors;
};

// Supplies saved state for load_state(): returns the elements [elements.begin, elements.end) of the
// flattened parameter `param` for state kind `kind`, any float dtype, numel = elements size. Throws
// Error(kInput) when the checkpoint lacks them.
using StateSource =
    std::function<torch::Tensor(const std::string& kind, const std::string& param, Range elements)>;

// A rank's share of the squared global gradient norm: Σg² of the elements it owns, and the part of
// that other ranks count too (replicated pieces; undefined: none). MasterState::reduce_norm sums
// the shares over the job.
struct NormShare {
  torch::Tensor owned_sq;
  torch::Tensor copies_sq;
};

// Autograd from `root` with its gradient `grad`, through root's gradient edge: root's data is never
// read (grad is checked against the shape autograd recorded), so a pipeline stage may free what it
// sent on (Megatron-LM's deallocate_output_tensor). A root that needs no gradient runs nothing.
void run_backward(const torch::Tensor& root, const torch::Tensor& grad);

class Engine : public ckpt::Stateful {
 public:
  ~Engine() override = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Stage 3: bracket forward segment k (EngineOptions::segments) with these; `output` is the
  // segment's output. No-ops at stages 0-2, so one forward serves every stage.
  virtual void pre_forward(size_t segment) {}
  virtual void post_forward(size_t segment, const torch::Tensor& output) {}

  // One micro-step: autograd on loss · loss_scale / micro.count, gradient communication. Between
  // two steps the micro-steps come in order 0, 1, ..., count - 1 with one count; anything else is
  // Error(kInternal).
  void backward(const torch::Tensor& loss, MicroStep micro = {});
  // The same micro-step for a pipeline stage before the last (train/pipeline.h): autograd from
  // `output`, what the stage sent on, with `output_grad`, its gradient from the next stage, which
  // the last stage's backward() scaled already (nothing is scaled here). An output that needs no
  // gradient (a stage with nothing to train) runs no autograd, only the micro-step's
  // communication. Only `output`'s autograd edge is read (run_backward), not its data.
  void backward_from(const torch::Tensor& output, const torch::Tensor& output_grad,
                     MicroStep micro = {});
  // After the backward() of the last micro-step (else Error(kInternal)): completes communication,
  // clips, updates (unless fp16 overflow), refreshes the parameters, zeroes the gradients.
  StepResult step(double lr);
  // Optional, before the backward() of a step's last micro-step: the learning rate that step() will
  // be given (else Error(kInternal) there). Without gradient clipping, fp16 loss scaling and
  // partial gradients (where no update waits for the global norm or for the sum of a partial
  // gradient over its group) each bucket (stages 0-2) or unit (stage 3) is then updated
  // as soon as its gradient is reduced, and its parameters refreshed, while backward goes on with
  // the earlier layers; the values are bit for bit those of updating in step().
  void set_step_lr(double lr) { step_lr_ = lr; }
  // Whether the stage and options let set_step_lr() move the update into backward.
  virtual bool can_update_during_backward() const { return false; }

  virtual MemoryReport bytes() const = 0;

  // Checkpoint support. The pieces are those of this rank's partition at every stage (at stage 0
  // too, so that saving is spread over the ranks); together the ranks' pieces cover every element
  // of every parameter exactly once, whatever the stage.
  virtual std::vector<StatePiece> owned_state() const = 0;
  // "master" followed by the optimizer's state names.
  virtual std::vector<std::string> state_kinds() const = 0;
  virtual int64_t step_count() const = 0;
  virtual LossScalerState loss_scaler_state() const = 0;
  // Collective. Asks `source` for every (kind, param, range) this rank holds (stage 0: everything),
  // loads it, then refreshes the compute parameters from the master weights. Works across world
  // sizes and stages because pieces are named by parameter and element range. Drops the gradients
  // of micro-steps done since the last step().
  void load_state(const StateSource& source, int64_t step_count, const LossScalerState& scaler);
  // Collective. Drops the gradients of the micro-steps done since the last step(), as if they had
  // not run: their communication completes, the gradients are zeroed and the next backward() is
  // micro-step 0 again. Parameters, master weights, optimizer and loss scaler are untouched. For a
  // trial micro-step (train/micro_batch_auto.h) run as a step's first of several, which updates
  // nothing during backward.
  void discard_micro_steps();

  // The engine as a checkpoint component (ckpt/stateful.h): the pieces of owned_state() as host
  // copies and {"optimizer_steps"}. restore_state() is collective: it checks that every parameter
  // this rank loads is saved with this run's shape (Error(kInput) naming it), then load_state()
  // with the loss scaler as it is: the scaler is a component of its own (loss_scaler()).
  int state_version() const override { return 1; }
  ckpt::State snapshot_state(ckpt::Snapshot how) const override;
  void restore_state(const ckpt::StateIn& in) override;
  virtual LossScaler& loss_scaler() = 0;

 protected:
  Engine() = default;

  // The implementations' parts of backward(), step() and load_state(), called once the micro-step
  // order has been checked. backward() runs before_autograd(micro), autograd (from the loss scaled
  // by backward_scale() / micro.count, or from backward_from()'s output), then after_autograd().
  virtual void before_autograd(MicroStep micro) = 0;
  virtual void after_autograd() = 0;
  virtual double backward_scale() const = 0;
  // step() is finish_step(reduce_norm(prepare_step()), lr), in parts so that engines over
  // different groups share one norm (GroupedEngine): prepare_step completes the gradients'
  // communication and returns this rank's share of the norm; reduce_norm sums the shares over the
  // job (collective) and decides an fp16 skip; finish_step updates unless skipped (or done during
  // backward), refreshes the parameters and zeroes the gradients.
  virtual NormShare prepare_step() = 0;
  virtual StepResult reduce_norm(const NormShare& share) = 0;
  virtual void finish_step(const StepResult& result, double lr) = 0;
  virtual void do_load_state(const StateSource& source, int64_t step_count,
                             const LossScalerState& scaler) = 0;
  virtual void do_discard() = 0;

  // The learning rate of set_step_lr() for the coming step, if any.
  const std::optional<double>& step_lr() const { return step_lr_; }

 private:
  friend class GroupedEngine;  // runs its engines' parts
  void check_in_order(MicroStep micro) const;
  void run_backward_of(const torch::Tensor& root, const torch::Tensor& root_grad, MicroStep micro);
  MicroStep done_{-1, 0};  // the last micro-step backward() ran since step(); index -1: none
  std::optional<double> step_lr_;
};

// Builds the engine for options.stage: a ShardedEngine for stages 0-2, a Stage3Engine for stage 3;
// with options.shard_group, one for each group its parameters' placements name, in the order of
// their first parameters, under a GroupedEngine. Error(kConfig) for options it cannot honour
// (stage, dtype, clipping; fp16 over several groups) and for a model without trainable elements.
// Precondition: the offload flags suit the stage (offload_optimizer 1-3, offload_param 3), which
// the config loader checks (config/validate.cpp).
std::unique_ptr<Engine> make_engine(std::vector<NamedParameter> params, comm::Communicator& comm,
                                    const OptimizerFactory& make_optimizer, EngineOptions options);

}  // namespace dstrain::zero
