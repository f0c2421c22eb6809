#pragma once
// Expert parallelism (parallel.expert_parallel_size = P) over the ranks of a job: the exchanges
// model/moe.h asks for, over the expert-parallel group of the layout (layout/parallel_layout.h:
// the experts' mesh, a second factorisation of each pipeline stage's ranks). Each rank of the
// group holds E/P of every MoE layer's experts; ZeRO shards them over the expert-data-parallel
// ranks, those that hold the same experts (ParallelGroups::expert_replicas), and everything else as
// without it.

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/model_config.h"
#include "model/moe.h"

namespace dstrain::train {

// Error(kConfig) naming parallel.expert_parallel_size in `config_path` unless the run can spread
// `model`'s experts (the model `name`) over its expert_parallel_size ranks: a Mixture-of-Experts
// model whose experts the size divides, without LoRA on the experts (lora.target_parameters).
void check_expert_parallel(const config::Config& config, const model::ModelConfig& model,
                           const std::string& name, const std::string& config_path);

// The shapes of rank 0 of an expert-parallel group of `size` (its E/size experts), without the
// group: for models built without memory to estimate one rank's memory. Its exchanges are
// Error(kInternal).
std::shared_ptr<model::ExpertParallel> expert_parallel_shapes(int size);

class ExpertParallelGroup final : public model::ExpertParallel {
 public:
  // `group`: the expert-parallel group (more than one rank); it must outlive this object.
  explicit ExpertParallelGroup(comm::Communicator& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.world_size(); }
  torch::Tensor exchange_counts(const torch::Tensor& counts) override;
  torch::Tensor exchange_rows(const torch::Tensor& x, std::vector<int64_t> receive,
                              std::vector<int64_t> send) override;

 private:
  comm::Communicator& group_;
};

}  // namespace dstrain::train
