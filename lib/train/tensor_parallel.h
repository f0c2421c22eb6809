#pragma once
// Tensor parallelism (parallel.tensor_parallel_size = T) over the ranks of a job: the groups and
// the collectives model/tensor_parallel.h asks for.
//
// Rank layout (layout/parallel_layout.h): tensor parallel innermost, so a tensor-parallel group is
// T consecutive ranks (one node: the launcher places consecutive ranks on one node). The ranks of
// a tensor-parallel group read the same samples and compute the same loss; each holds its slice of
// the model. ZeRO shards each slice over the ranks that hold it (the data- and sequence-parallel
// ranks of that slice in its stage: ParallelGroups::slice_replicas), so stage 3 is 2-D: FSDP × TP.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/stateful.h"
#include "comm/communicator.h"
#include "lora/lora_model.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace dstrain::train {

class TensorParallelGroup final : public model::TensorParallel {
 public:
  // `group`: the tensor-parallel group, null for a group of one; `replicas`: the ranks holding
  // this rank's slice (train/parallel_groups.h). Both must outlive this object.
  TensorParallelGroup(comm::Communicator* group, comm::Communicator& replicas,
                      bool sequence_parallel);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool sequence_parallel() const override { return sequence_parallel_; }
  torch::Tensor enter(const torch::Tensor& x) override;
  torch::Tensor leave(const torch::Tensor& x) override;
  torch::Tensor gather_rows(const torch::Tensor& x) override;
  torch::Tensor reduce_scatter_rows(const torch::Tensor& x) override;
  torch::Tensor gather_last(const torch::Tensor& x) override;
  void all_reduce_(torch::Tensor& x, bool max) override;

  // The ranks holding this rank's slice: where ZeRO shards it.
  comm::Communicator& replicas() { return replicas_; }
  // Collective over the group: the whole parameter placed as `placement` (of the model or its
  // adapters) from every rank's slice `local` of it (a parameter every rank holds whole: the
  // group's rank 0's copy); `local` itself for a group of one.
  torch::Tensor whole(const torch::Tensor& local, const model::Placement& placement);
  // The same for a gradient read outside the engine (which sums a partial gradient over the group
  // in its step): a partial gradient summed over the group, any other as whole().
  torch::Tensor whole_gradient(const torch::Tensor& local, const model::Placement& placement);
  // The group itself (the world's own for size 1 is never used).
  comm::Communicator& group();

 private:
  comm::Communicator* group_;
  comm::Communicator& replicas_;
  int size_;
  int rank_;
  bool sequence_parallel_;
};

// The shapes of rank 0 of a tensor-parallel group of `size`, without the group: for models built
// without memory to estimate one rank's memory (`dstrain estimate`). Its collectives are
// Error(kInternal).
std::shared_ptr<model::TensorParallel> tensor_parallel_shapes(int size, bool sequence_parallel);

// Each parameter of a model and of its adapters by name: its shape on this rank and its placement
// (model/placement.h, as the blocks and the adapters declare it).
struct PlacedShape {
  std::vector<int64_t> shape;
  model::Placement placement;
};
using PlacedShapes = std::map<std::string, PlacedShape>;
// `lora`: the model's adapters, or null.
PlacedShapes placed_shapes(const model::DecoderModelImpl& model, const lora::LoraModel* lora);

// Where this rank's slices lie: the size of the group each placement is cut over
// (model::Placement::group) and this rank's place in it.
struct PlacementCuts {
  struct Cut {
    int64_t size = 1;
    int64_t rank = 0;
  };
  Cut tensor;  // the tensor-parallel group's
  Cut expert;  // the expert-parallel group's (model::DecoderModelImpl::expert_parallel)
  Cut of(const model::Placement& placement) const;
};
PlacementCuts placement_cuts(const model::DecoderModelImpl& model, const model::TensorParallel& tp);

// The values of `model`'s parameters (one rank's slice, its shapes) read from `whole`, the whole
// model's values by name: each local range becomes the whole parameter's elements of this rank's
// slice (contiguous for a slice along dimension 0, a segment of every row for a later dimension,
// read in blocks of rows).
model::ValueSource slice_source(model::ValueSource whole, const model::DecoderModelImpl& model,
                                const model::TensorParallel& tp);

// The engine's checkpoint state in the whole model's coordinates, on every layout (without tensor
// parallelism it passes the pieces through), so that checkpoints stay layout-free: a rank's
// pieces become pieces of the whole parameters by their placements (a slice along dimension 0
// moved by the slice's offset, a column slice saved as ckpt::Columns, a replicated parameter saved
// by the group's rank 0 alone), and a restore reads this rank's slice of the whole parameters from
// whatever layout wrote them. `engine` must outlive it; `model` (the rank's slice) and `lora`
// (its adapters, or null) give the parameters' shapes on this rank.
class WholeCoordinateState final : public ckpt::Stateful {
 public:
  WholeCoordinateState(ckpt::Stateful& engine, const model::DecoderModelImpl& model,
                       const lora::LoraModel* lora, const model::TensorParallel& tp);
  int state_version() const override { return engine_.state_version(); }
  ckpt::State snapshot_state(ckpt::Snapshot how) const override;
  void restore_state(const ckpt::StateIn& in) override;

 private:
  ckpt::Stateful& engine_;
  PlacedShapes shapes_;  // this rank's
  PlacementCuts cuts_;
};

// Error(kConfig) naming the keys unless data.max_length / sequence_parallel_size is divisible by
// T under tensor parallelism's sequence parallelism (each rank keeps an equal share of the token
// rows between the layers' parallel regions).
void check_tensor_parallel_length(int64_t max_length, int sequence_parallel, int size,
                                  bool tensor_sequence_parallel);

}  // namespace dstrain::train
