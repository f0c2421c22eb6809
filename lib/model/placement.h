#pragma once
// Where a parameter's elements live across a tensor-parallel group, declared by the module that
// creates the parameter (a projection, a norm, an embedding) and kept with it in its block's list
// (blocks.h: ModelBlock::parameters). Everything outside the model that needs whole tensors, or
// counts a parameter once, reads this: the slices of the initial values, the checkpoint pieces and
// their gathers, the gradient norm, LoRA's split of its adapters, the adapter export.
//
// A split parameter is cut along one dimension into T equal slices, rank r of the group holding
// slice r; a replicated one is whole on every rank. A replicated parameter whose gradient on a
// rank is only that rank's part (a norm on the rank's token rows, a q/k norm over its heads) is
// read through the group's summed gradient (tensor_parallel.h), and so stays equal on every rank.

#include <cstdint>
#include <string>

namespace dstrain::model {

enum class PlacementKind {
  kReplicated,  // whole on every rank
  kColumn,      // a column-parallel projection's weight or bias: its output features (dim 0)
  kRow,         // a row-parallel projection's weight: its input features (dim 1)
  kVocabulary,  // an embedding or head matrix [V, C]: its vocabulary rows (dim 0)
  kExperts,     // a stack of experts [E, ...]: its experts (dim 0)
};

// The group a split parameter is cut over: the tensor-parallel ranks, or (a MoE layer's expert
// stacks under expert parallelism) the expert-parallel ranks (layout/parallel_layout.h), whose
// data-parallel replicas are then the expert-data-parallel ranks.
enum class PlacementGroup : uint8_t { kTensor, kExpert };

struct Placement {
  PlacementKind kind = PlacementKind::kReplicated;
  // Replicated only: this rank's gradient of it is its part, summed over the group by the forward.
  bool partial_gradient = false;
  PlacementGroup group = PlacementGroup::kTensor;

  // The dimension cut into the group's slices; -1 when replicated.
  int dim() const;
  bool replicated() const { return kind == PlacementKind::kReplicated; }
  bool operator==(const Placement& o) const {
    return kind == o.kind && partial_gradient == o.partial_gradient && group == o.group;
  }

  static Placement replicated_with(bool partial_gradient) {
    return {PlacementKind::kReplicated, partial_gradient};
  }
  static Placement split(PlacementKind kind, PlacementGroup group = PlacementGroup::kTensor) {
    return {kind, false, group};
  }
};

// "replicated", "column", "row", "vocabulary", "experts" (with " (partial gradient)", or " over
// the expert-parallel ranks").
std::string to_string(const Placement& placement);

}  // namespace dstrain::model
