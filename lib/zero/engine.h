#pragma once
// The ZeRO data-parallel engine: owns the trainable parameters' flat buffers, their gradients, the
// fp32 master weights and the optimizer, and does the communication of ZeRO stages 0, 1 and 2.
//
//   stage 0  gradients all-reduced (average) in buckets; every rank keeps the full fp32 master and
//            optimizer state and runs the same update (data parallel).
//   stage 1  optimizer state and master weights sharded: gradients reduce-scattered into this
//            rank's shard on the last micro-step, each rank updates its shard, parameters are
//            all-gathered afterwards.
//   stage 2  as stage 1, and gradients sharded too: buckets are reduce-scattered during backward as
//            they fill, on every micro-step, accumulating in the shard; no full-size gradient
//            buffer.
// Ownership, buckets and padding: partition.h. Communication during backward: grad_reducer.h.
//
// Use, per optimizer step, with A = gradient_accumulation_steps:
//   for (int i = 0; i < A; ++i) engine.backward(model_loss(micro_batch[i]));
//   StepResult r = engine.step(lr);   // zero_grad is part of step()
// `loss` is this rank's mean loss over its micro-batch; backward scales it by 1/A (and the fp16
// loss scale); gradients are averaged over ranks, so equal micro-batches give the global-batch
// mean.
//
// Parameters are passed in forward order (as named_parameters() lists them): the flat layout
// follows that order, and buckets are launched from the last to the first, matching backward.
// Construction replaces each parameter's storage by a view into the flat buffer (in the compute
// dtype), so the model keeps using the same tensors. Every call that communicates is collective:
// all ranks call backward/step/load_state in the same order. Not thread-safe. Gradient hooks run on
// the autograd thread; backward must go through this engine, not loss.backward().
//
// Memory (Ψ trainable elements, N ranks, mixed precision with Adam): compute params 2Ψ; gradients
// 2Ψ (stages 0/1) or 2Ψ/N (stage 2) in the compute dtype; master 4Ψ and optimizer 8Ψ, divided by N
// at stages 1/2. In fp32 compute at stage 0 the master weights are the parameter buffer itself (no
// copy; bytes().master_weights is 0). At stages 1/2 the master shard is a separate copy even in
// fp32, because a rank's elements are spread over all buckets. Transient buffers (bucket buffers
// during backward, the fp32 gradient copy and the all-gather inputs inside step()) are freed before
// step() returns and are reported separately.
//
// offload_optimizer (stages 1-3): the master shard and the optimizer state live in host memory
// (pinned with CUDA parameters); step() copies the gradient shard to the host, updates there and
// streams each bucket's updated chunk back as its all-gather input. MemoryReport::host_bytes.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "comm/communicator.h"
#include "optim/optimizer.h"
#include "zero/grad_hooks.h"
#include "zero/loss_scaler.h"
#include "zero/partition.h"

namespace dstrain::zero {

class GradReducer;
class Stage3Engine;

struct NamedParameter {
  std::string name;
  torch::Tensor tensor;  // a leaf that requires grad (unless frozen); all on one device
  int unit = 0;          // stage 3: the unit (e.g. decoder block) it is gathered with
  // Stage 3 only: a parameter that is not trained (a LoRA base weight). It is sharded and gathered
  // like the others but has no gradient, master copy or optimizer state, and is not in the
  // checkpoint state.
  bool frozen = false;
};

// Builds the optimizer for a master shard of `shard_numel` fp32 elements; `no_decay` are the shard
// ranges of norms and biases (see no_decay.h).
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(
    int64_t shard_numel, std::vector<optim::Range> no_decay)>;

// Initial values of parameter `name`: its flattened elements [begin, end) as a 1-D tensor of any
// float dtype. Lets a stage-3 engine build its shards from files or a seeded initialisation while
// the parameters themselves hold no memory (model::Materialize::kNo).
using InitialValues =
    std::function<torch::Tensor(const std::string& name, int64_t begin, int64_t end)>;

struct EngineOptions {
  int stage = 0;                             // 0, 1, 2 or 3
  int64_t reduce_bucket_size = 500'000'000;  // elements per communication bucket
  bool overlap_comm = true;                  // launch buckets during backward as they fill
  bool contiguous_gradients = true;          // stage 2: copy grads into buckets as they arrive
  int gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;                     // max global L2 norm; 0 disables
  torch::ScalarType compute_dtype = torch::kFloat32;  // kFloat32, kBFloat16 or kHalf
  LossScalingOptions loss_scaling;                    // used only with kHalf
  // Stage 3 (see stage3.h). `segments[k]`: the units forward segment k reads, in forward order;
  // empty: one segment per unit, in unit order.
  std::vector<std::vector<int>> segments;
  int64_t prefetch_bucket_size = 50'000'000;      // elements gathered ahead of use
  int64_t param_persistence_threshold = 100'000;  // smaller parameters stay gathered
  bool offload_optimizer = false;  // stages 1-3: master, optimizer state and the update on the host
  bool offload_param = false;      // stage 3: parameter shards on the host
  // Stage 3: where the initial values come from; unset: from the parameters themselves (which
  // must then hold them). Each rank asks only for its own shard's elements and the persistent
  // (small) parameters.
  InitialValues initial_values;
};

struct StepResult {
  double grad_norm = 0;   // global L2 norm of the averaged, unscaled gradient, before clipping
  double loss_scale = 1;  // loss scale this step's gradients were computed with
  bool skipped = false;   // fp16 overflow: no update was made
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

// The factor the summed fp32 gradient is multiplied by before the update: 1/loss_scale, times
// clip/(norm + 1e-6) when `clip` > 0 and the (unscaled) global norm exceeds it.
double gradient_coefficient(const StepResult& r, double clip);

class Engine {
 public:
  Engine(std::vector<NamedParameter> params, comm::Communicator& comm,
         const OptimizerFactory& make_optimizer, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Stage 3: bracket forward segment k (EngineOptions::segments) with these; `output` is the
  // segment's output. No-ops at stages 0-2, so one forward serves every stage.
  void pre_forward(size_t segment);
  void post_forward(size_t segment, const torch::Tensor& output);

  // One micro-step: autograd on loss · loss_scale / accumulation_steps, gradient communication.
  void backward(const torch::Tensor& loss);
  // After exactly gradient_accumulation_steps backward() calls: completes communication, clips,
  // updates (unless fp16 overflow), refreshes the parameters, zeroes the gradients.
  StepResult step(double lr);

  MemoryReport bytes() const;

  // Checkpoint support. The pieces are those of this rank's partition at every stage (at stage 0
  // too, so that saving is spread over the ranks); together the ranks' pieces cover every element
  // of every parameter exactly once, whatever the stage.
  std::vector<StatePiece> owned_state() const;
  // "master" followed by the optimizer's state names.
  std::vector<std::string> state_kinds() const;
  int64_t step_count() const;
  LossScalerState loss_scaler_state() const;
  // Collective. Asks `source` for every (kind, param, range) this rank holds (stage 0: everything),
  // loads it, then refreshes the compute parameters from the master weights. Works across world
  // sizes and stages because pieces are named by parameter and element range.
  void load_state(const StateSource& source, int64_t step_count, const LossScalerState& scaler);

  const Partition& partition() const { return partition_; }
  const EngineOptions& options() const { return options_; }

 private:
  struct ParamInfo {
    std::string name;
    std::vector<int64_t> shape;
    torch::Tensor tensor;
  };

  void validate() const;
  void build_flat_buffers(const std::vector<NamedParameter>& params);
  void build_master(const std::vector<NamedParameter>& params);
  std::vector<Range> no_decay_ranges() const;
  void install_hooks();
  std::vector<ParamPiece> master_pieces() const;
  int64_t master_offset(const ParamPiece& piece) const;
  torch::Tensor fp32_gradients();
  torch::TensorOptions shard_options() const;
  double global_grad_sq(const torch::Tensor& grad32);
  void refresh_params();
  void zero_grad();

  comm::Communicator& comm_;
  EngineOptions options_;
  Partition partition_;
  std::vector<ParamInfo> params_;
  torch::Tensor flat_params_;  // [padded_numel] compute dtype; parameters are views of it
  torch::Tensor flat_grad_;    // stages 0/1: [padded_numel] compute dtype; .grad are views of it
  torch::Tensor grad_shard_;   // stage 2: [shard_numel]; stage 1: transient on the last micro-step
  torch::Tensor master_;       // fp32; stage 0: [padded_numel], stages 1/2: [shard_numel]
  bool master_aliases_params_ = false;
  std::unique_ptr<optim::Optimizer> optimizer_;
  LossScaler scaler_;
  std::unique_ptr<GradReducer> reducer_;
  std::vector<AccumulatorHandle> hooks_;
  int micro_step_ = 0;
  std::unique_ptr<Stage3Engine> stage3_;  // stage 3: does everything
};

}  // namespace dstrain::zero
