#pragma once
// The communicators of one rank's groups, cut from the world once, by the layout
// (layout/parallel_layout.h). Everything that runs a collective over part of the world takes its
// group from here: the pipeline, tensor- and sequence-parallel groups, and the ranks ZeRO shards
// over.
//
// Construction is collective over the world: every rank splits it in one order (an axis whose
// groups are single ranks or the whole world is not split). The groups must be destroyed before
// the world, and outlive whatever uses them (the model holds the tensor-parallel group).

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "layout/parallel_layout.h"

namespace dstrain::train {

class ParallelGroups {
 public:
  ParallelGroups(comm::Communicator& world, layout::ParallelLayout layout);

  const layout::ParallelLayout& layout() const { return layout_; }
  int rank() const { return rank_; }  // in the world
  // This rank's coordinate on `axis` (layout::ParallelLayout::coordinate).
  int coordinate(layout::Axis axis) const { return layout_.coordinate(axis, rank_); }
  int size(layout::Axis axis) const { return layout_.size(axis); }

  comm::Communicator& world() { return world_; }
  // This rank's pipeline stage (the world without pipeline parallelism).
  comm::Communicator& stage() { return *stage_; }
  // The ranks holding this rank's slice of its stage: where ZeRO shards it (the stage without
  // tensor parallelism).
  comm::Communicator& slice_replicas() { return *slice_replicas_; }
  // Null where the axis has size 1.
  comm::Communicator* pipeline() { return pipeline_; }
  comm::Communicator* tensor() { return tensor_; }
  comm::Communicator* sequence() { return sequence_; }
  // Expert parallelism (null without it): the ranks that share each MoE layer's experts, and the
  // ranks that hold the same experts (where ZeRO shards them; a group of one has a communicator
  // too).
  comm::Communicator* expert() { return expert_; }
  comm::Communicator* expert_replicas() { return expert_replicas_; }

 private:
  // The group over `axes`: a split of the world (kept in owned_); null for groups of one rank
  // unless `even_of_one`.
  comm::Communicator* group(layout::Axes axes, bool even_of_one = false);

  comm::Communicator& world_;
  layout::ParallelLayout layout_;
  int rank_;
  std::vector<std::unique_ptr<comm::Communicator>> owned_;  // the splits, in the order made
  comm::Communicator* stage_ = nullptr;
  comm::Communicator* pipeline_ = nullptr;
  comm::Communicator* tensor_ = nullptr;
  comm::Communicator* slice_replicas_ = nullptr;
  comm::Communicator* sequence_ = nullptr;
  comm::Communicator* expert_ = nullptr;
  comm::Communicator* expert_replicas_ = nullptr;
};

}  // namespace dstrain::train
