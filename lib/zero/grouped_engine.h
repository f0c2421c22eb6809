#pragma once
// Engines over different groups of ranks as one (engine.h: EngineOptions::shard_group): under
// expert parallelism a MoE layer's expert stacks are sharded over the expert-data-parallel ranks
// and everything else over the data- and sequence-parallel ranks, each by an engine of its own
// (ZeRO's stage over its own group), while the trainer sees one engine:
//
//   forward     every engine brackets every segment (stage 3 gathers each its own units)
//   backward    each engine prepares, one autograd runs, each completes its communication
//   step        each engine's share of Σg², one all-reduce over the job (clipping and the norm
//               count every parameter once), then each engine's update with that norm
//   checkpoint  the engines' pieces together (the parameters' names keep them apart)
//
// The engines keep their own optimizers over their own shards (one learning rate, one step
// count). fp16's loss scale is not shared between them: make_engine refuses fp16 here.

#include <memory>
#include <string>
#include <vector>

#include "zero/engine.h"

namespace dstrain::zero {

class GroupedEngine final : public Engine {
 public:
  // `parts`: at least one, each over its own parameters.
  explicit GroupedEngine(std::vector<std::unique_ptr<Engine>> parts);

  void pre_forward(size_t segment) override;
  void post_forward(size_t segment, const torch::Tensor& output) override;
  bool can_update_during_backward() const override;
  MemoryReport bytes() const override;
  std::vector<StatePiece> owned_state() const override;
  std::vector<std::string> state_kinds() const override { return parts_.front()->state_kinds(); }
  int64_t step_count() const override { return parts_.front()->step_count(); }
  LossScalerState loss_scaler_state() const override { return parts_.front()->loss_scaler_state(); }
  LossScaler& loss_scaler() override { return parts_.front()->loss_scaler(); }

 private:
  void before_autograd(MicroStep micro) override;
  void after_autograd() override;
  double backward_scale() const override { return parts_.front()->backward_scale(); }
  NormShare prepare_step() override;
  StepResult reduce_norm(const NormShare& share) override;
  void finish_step(const StepResult& result, double lr) override;
  void do_load_state(const StateSource& source, int64_t step_count,
                     const LossScalerState& scaler) override;
  void do_discard() override;

  std::vector<std::unique_ptr<Engine>> parts_;
};

}  // namespace dstrain::zero
