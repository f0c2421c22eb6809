#pragma once
// The parallel layout of a job: which ranks hold which pipeline stage, which data-parallel
// replica, which piece of a sequence and which slice of a layer. It is pure rank arithmetic (no
// LibTorch, no communicator), computed once from the sizes, and every part of dstrain that needs
// to know where a rank stands asks it: the trainer's groups (train/parallel_groups.h), the seeds,
// the loss means, the data loader's replica, `dstrain launch --dry-run`, `dstrain debug forward`.
//
// The mesh, outermost axis first (the launcher places consecutive ranks on one node, so the
// innermost axis, whose collectives run at every layer, stays on one node):
//
//   rank = ((pipeline · D + data) · S + sequence) · T + tensor
//
//   pipeline  P stages, each a block of D·S·T consecutive ranks (train/pipeline.h)
//   data      D = world / (P·S·T) replicas reading different samples (ZeRO shards over them)
//   sequence  S ranks sharing each sequence (DeepSpeed-Ulysses, train/sequence_parallel.h)
//   tensor    T ranks sharing each layer (Megatron-LM, model/tensor_parallel.h)
//
// The expert mesh is a second factorisation of the same D·S·T ranks of a stage (Megatron-LM's
// MoE "parallel folding"):
//
//   rank within its stage = (expert_data · E + expert) · ET + expert_tensor,  ET · E · ED = D·S·T
//
// so expert parallelism may span tensor- and sequence-parallel ranks. Its sizes are 1 unless a run
// asks for experts spread over ranks.
//
// A group is named by the axes its ranks differ on: the ranks that share every other coordinate.
// Its members are ranked in the order of their world ranks (what Communicator::split does), which
// is the mixed-radix order of their coordinates on those axes.

#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::config {
struct ParallelSection;
}

namespace dstrain::layout {

enum class Axis : uint8_t {
  kPipeline,
  kData,
  kSequence,
  kTensor,
  kExpertData,
  kExpert,
  kExpertTensor,
};

// A set of axes; `Axes(Axis::kData) | Axis::kSequence`.
class Axes {
 public:
  constexpr Axes() = default;
  constexpr Axes(Axis a) : bits_(static_cast<uint8_t>(1u << static_cast<unsigned>(a))) {}
  constexpr Axes operator|(Axes o) const { return Axes(static_cast<uint8_t>(bits_ | o.bits_)); }
  constexpr bool has(Axis a) const { return (bits_ >> static_cast<unsigned>(a)) & 1u; }
  constexpr bool empty() const { return bits_ == 0; }
  constexpr bool operator==(Axes o) const { return bits_ == o.bits_; }

 private:
  constexpr explicit Axes(uint8_t bits) : bits_(bits) {}
  uint8_t bits_ = 0;
};
constexpr Axes operator|(Axis a, Axis b) {
  return Axes(a) | b;
}

// The groups the trainer uses, by the axes their ranks differ on.
inline constexpr Axes kStage = Axis::kData | Axis::kSequence | Axis::kTensor;  // one stage's ranks
// The ranks holding the same slice of the same stage: where ZeRO shards it.
inline constexpr Axes kSliceReplicas = Axis::kData | Axis::kSequence;
// The ranks that read the same samples (they differ only in what of them they compute).
inline constexpr Axes kSameSamples = Axis::kPipeline | Axis::kSequence | Axis::kTensor;

struct Sizes {
  int pipeline = 1;       // P
  int sequence = 1;       // S
  int tensor = 1;         // T
  int expert = 1;         // E
  int expert_tensor = 1;  // ET
};

class ParallelLayout {
 public:
  // A job of one rank.
  ParallelLayout() : ParallelLayout(1, Sizes{}) {}
  // Error(kConfig), with the numbers, unless every size is at least 1, P·S·T divides `world` and
  // E·ET divides the ranks of a stage.
  ParallelLayout(int world, Sizes sizes);

  int world_size() const { return world_; }
  int size(Axis axis) const;
  // The product of the sizes of `axes`: the ranks of one such group.
  int group_size(Axes axes) const;
  // `rank`'s coordinate on `axis`.
  int coordinate(Axis axis, int rank) const;

  // The group of `rank` over `axes` (the ranks that differ from it only on those axes): its index
  // among the groups over `axes` (a split() color), its members in rank order, and `rank`'s place
  // among them. `axes` mixes no expert axis with the data, sequence or tensor axis
  // (Error(kInternal)): the two meshes cut the same ranks two ways.
  int group_index(Axes axes, int rank) const;
  std::vector<int> group_ranks(Axes axes, int rank) const;
  int group_rank(Axes axes, int rank) const;

  // One line: "pipeline 2 x data 2 x sequence 1 x tensor 2 (8 ranks)".
  std::string describe() const;

 private:
  // The coordinates of `rank` along the mesh the axes belong to, outermost first, and their sizes.
  struct Mesh {
    std::vector<Axis> axes;
    std::vector<int> sizes;
  };
  Mesh mesh_of(Axes axes) const;
  std::vector<int> coordinates(const Mesh& mesh, int rank) const;
  int rank_of(const Mesh& mesh, const std::vector<int>& coordinates) const;

  int world_;
  Sizes sizes_;
  int data_;         // D
  int expert_data_;  // ED
};

// The layout of a run's `parallel` section over `world` ranks (its sizes were validated with the
// config; Error(kConfig) as the constructor's otherwise).
ParallelLayout layout_of(const config::ParallelSection& parallel, int world);

}  // namespace dstrain::layout
