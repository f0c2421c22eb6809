#include "train/parallel_groups.h"

#include "core/error.h"

namespace dstrain::train {

using layout::Axis;

ParallelGroups::ParallelGroups(comm::Communicator& world, layout::ParallelLayout layout)
    : world_(world), layout_(std::move(layout)), rank_(world.rank()) {
  if (layout_.world_size() != world.world_size()) {
    fail(ErrorKind::kInternal, "parallel groups: a layout of {} ranks for a world of {}",
         layout_.world_size(), world.world_size());
  }
  // One order on every rank: each split is collective over the world. Without pipeline
  // parallelism the stage is the world; without tensor parallelism a slice is the whole stage.
  stage_ = layout_.size(Axis::kPipeline) > 1 ? group(layout::kStage, true) : &world_;
  pipeline_ = group(Axis::kPipeline);
  tensor_ = group(Axis::kTensor);
  slice_replicas_ = tensor_ != nullptr ? group(layout::kSliceReplicas, true) : stage_;
  sequence_ = group(Axis::kSequence);
  if (layout_.size(Axis::kExpert) > 1) {
    expert_ = group(Axis::kExpert);
    expert_replicas_ = group(Axis::kExpertData, true);
  }
}

comm::Communicator* ParallelGroups::group(layout::Axes axes, bool even_of_one) {
  if (layout_.group_size(axes) == 1 && !even_of_one) return nullptr;
  // A communicator of its own even when it spans the world: its collectives then never queue
  // behind the world's (on a GPU each communicator has its stream).
  owned_.push_back(world_.split(layout_.group_index(axes, rank_)));
  return owned_.back().get();
}

}  // namespace dstrain::train
