#pragma once
// ZeRO stages 0, 1 and 2 (engine.h has the stage table): the trainable parameters live in one flat
// buffer cut into communication buckets (partition.h), their gradients are reduced bucket by bucket
// during backward (grad_reducer.h), and the fp32 master and the update are a MasterState
// (master_state.h). Built by make_engine(), which validates the options.
//
// Parameters are passed in forward order (as named_parameters() lists them): the flat layout
// follows that order, and buckets are launched from the last to the first, matching backward.
// Construction replaces each parameter's storage by a view into the flat buffer (in the compute
// dtype), and at stages 0/1 each .grad by a view into the flat gradient buffer.
//
// Micro-steps: stages 0/1 accumulate locally (autograd adds into .grad) and communicate on the last
// micro-step only; stage 2 reduce-scatters on every micro-step, into the shard on the first and
// added to it on the others.
//
// Memory (Ψ trainable elements, N ranks, mixed precision with Adam): compute params 2Ψ; gradients
// 2Ψ (stages 0/1) or 2Ψ/N (stage 2) in the compute dtype; master 4Ψ and optimizer 8Ψ, divided by N
// at stages 1/2. In fp32 compute at stage 0 the master weights are the parameter buffer itself (no
// copy; bytes().master_weights is 0). At stages 1/2 the master shard is a separate copy even in
// fp32, because a rank's elements are spread over all buckets. Transient buffers (bucket buffers
// during backward, the fp32 gradient copy and the all-gather inputs inside step()) are freed before
// step() returns and are reported separately.
//
// offload_optimizer (stages 1/2): the master shard and the optimizer state live in host memory
// (pinned with CUDA parameters); step() copies the gradient shard to the host, updates there and
// streams each bucket's updated chunk back as its all-gather input.
//
// The update goes bucket by bucket, from the last bucket to the first: a bucket's part of the
// master is updated, then its parameters are refreshed (a copy at stage 0, the bucket's all-gather
// launched at stages 1/2, so that it overlaps the update of the next bucket). Without clipping and
// fp16 loss scaling the update needs no global norm, and once the trainer has said the step's
// learning rate (Engine::set_step_lr) it moves into the last backward: the gradient reducer calls
// back as each bucket's reduction completes, the bucket is updated there and its all-gather
// launched while backward goes on with the earlier layers (whose buckets come later); step() then
// completes the last buckets, all-reduces Σg² for the reported norm and waits for the parameters.
// Safe because a bucket is launched only once every parameter in it has its final gradient, after
// which backward reads none of them again.

#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "comm/communicator.h"
#include "zero/engine.h"
#include "zero/grad_hooks.h"
#include "zero/master_state.h"
#include "zero/partition.h"

namespace dstrain::zero {

class GradReducer;

class ShardedEngine final : public Engine {
 public:
  ShardedEngine(std::vector<NamedParameter> params, comm::Communicator& comm,
                const OptimizerFactory& make_optimizer, EngineOptions options);
  ~ShardedEngine() override;

  MemoryReport bytes() const override;
  std::vector<StatePiece> owned_state() const override { return master_->owned_state(); }
  std::vector<std::string> state_kinds() const override { return master_->state_kinds(); }
  int64_t step_count() const override { return master_->step_count(); }
  LossScalerState loss_scaler_state() const override { return master_->loss_scaler_state(); }
  LossScaler& loss_scaler() override { return master_->scaler(); }

  const Partition& partition() const { return partition_; }
  bool can_update_during_backward() const override { return master_->can_update_during_backward(); }

 private:
  struct ParamInfo {
    std::string name;
    std::vector<int64_t> shape;
    torch::Tensor tensor;
    model::Placement placement{};  // NamedParameter::placement
  };

  void before_autograd(MicroStep micro) override;
  void after_autograd() override;
  double backward_scale() const override { return master_->loss_scale(); }
  NormShare prepare_step() override;
  StepResult reduce_norm(const NormShare& share) override;
  void finish_step(const StepResult& result, double lr) override;
  void do_discard() override;
  void do_load_state(const StateSource& source, int64_t step_count,
                     const LossScalerState& scaler) override;

  void check_params(const std::vector<NamedParameter>& params);
  torch::Tensor allocate_master(const torch::Tensor& any_param) const;
  void allocate_flat_buffers(const torch::TensorOptions& compute);
  void fill_initial_values(const std::vector<NamedParameter>& params, const torch::Tensor& master);
  MasterLayout master_layout() const;
  std::vector<ParamPiece> master_pieces() const;
  int64_t master_offset(const ParamPiece& piece) const;
  void install_hooks();
  torch::Tensor fp32_gradients() const;
  torch::Tensor local_grad_sq(const torch::Tensor& grad32) const;
  // Where bucket `bucket`'s part of the master and of the gradient sits: stage 0 its flat range,
  // stages 1/2 this rank's chunk of it in the shard.
  Range in_master(size_t bucket) const;
  // Updates the bucket's part of the master from its fp32 gradient (scaled by `coef` unless
  // undefined) and refreshes its parameters (refresh_bucket).
  void update_bucket(size_t bucket, torch::Tensor grad32, const torch::Tensor& coef);
  // The reducer's callback: the bucket's reduced gradient is in place during the last backward.
  void update_reduced_bucket(size_t bucket);
  void refresh_params();
  void refresh_bucket(size_t bucket);
  // The bucket's bf16 parameters when the optimizer can write them during its update (stage 0, a
  // bf16 compute copy beside the master), so that no refresh_bucket() follows; else undefined.
  torch::Tensor compute_copy_of(size_t bucket) const;
  void wait_for_params();
  void zero_grad();

  comm::Communicator& comm_;
  EngineOptions options_;
  Partition partition_;
  std::vector<ParamInfo> params_;
  torch::Tensor flat_params_;  // [padded_numel] compute dtype; parameters are views of it
  torch::Tensor flat_grad_;    // stages 0/1: [padded_numel] compute dtype; .grad are views of it
  torch::Tensor grad_shard_;   // stage 2: [shard_numel]; stage 1: transient on the last micro-step
  // Where the gradient shard lives: in the compute dtype beside the parameters, or, offloading the
  // optimizer, in fp32 beside the master on the host, streamed there bucket by bucket
  // (grad_reducer.h).
  torch::TensorOptions grad_shard_options_;
  // fp32; stage 0: [padded_numel] (the flat parameter buffer itself in fp32), stages 1/2:
  // [shard_numel]
  std::unique_ptr<MasterState> master_;
  // Between prepare_step() and finish_step(): the reduced gradient in master coordinates (fp32),
  // unless the update ran during backward.
  torch::Tensor grad32_;
  std::unique_ptr<GradReducer> reducer_;
  std::vector<AccumulatorHandle> hooks_;
  // Parameter all-gathers launched by refresh_bucket(), with their buffers, until
  // wait_for_params().
  std::vector<std::unique_ptr<comm::Work>> gathers_;
  std::vector<torch::Tensor> gather_buffers_;
};

}  // namespace dstrain::zero
