#include "layout/parallel_layout.h"

#include <fmt/format.h>

#include "config/config.h"
#include "core/error.h"

namespace dstrain::layout {
namespace {

bool is_expert(Axis a) {
  return a == Axis::kExpertData || a == Axis::kExpert || a == Axis::kExpertTensor;
}
bool is_dense_inner(Axis a) {
  return a == Axis::kData || a == Axis::kSequence || a == Axis::kTensor;
}

}  // namespace

ParallelLayout::ParallelLayout(int world, Sizes sizes) : world_(world), sizes_(sizes) {
  if (world < 1 || sizes.pipeline < 1 || sizes.sequence < 1 || sizes.tensor < 1 ||
      sizes.expert < 1 || sizes.expert_tensor < 1) {
    fail(ErrorKind::kConfig,
         "parallel layout: world {} with pipeline {}, sequence {}, tensor {}, expert {}, expert "
         "tensor {}: every size must be at least 1",
         world, sizes.pipeline, sizes.sequence, sizes.tensor, sizes.expert, sizes.expert_tensor);
  }
  const int cut = sizes.pipeline * sizes.sequence * sizes.tensor;
  if (world % cut != 0) {
    fail(ErrorKind::kConfig,
         "the world size ({}) is not divisible by parallel.pipeline_parallel_size ({}) x "
         "parallel.sequence_parallel_size ({}) x parallel.tensor_parallel_size ({}): world = "
         "pipeline stages x data-parallel degree x sequence_parallel_size x tensor_parallel_size",
         world, sizes.pipeline, sizes.sequence, sizes.tensor);
  }
  data_ = world / cut;
  const int stage = world / sizes.pipeline;
  if (stage % (sizes.expert * sizes.expert_tensor) != 0) {
    fail(ErrorKind::kConfig,
         "a pipeline stage's {} ranks are not divisible by parallel.expert_parallel_size ({}) x "
         "the experts' tensor-parallel size ({})",
         stage, sizes.expert, sizes.expert_tensor);
  }
  expert_data_ = stage / (sizes.expert * sizes.expert_tensor);
}

int ParallelLayout::size(Axis axis) const {
  switch (axis) {
    case Axis::kPipeline:
      return sizes_.pipeline;
    case Axis::kData:
      return data_;
    case Axis::kSequence:
      return sizes_.sequence;
    case Axis::kTensor:
      return sizes_.tensor;
    case Axis::kExpertData:
      return expert_data_;
    case Axis::kExpert:
      return sizes_.expert;
    case Axis::kExpertTensor:
      return sizes_.expert_tensor;
  }
  return 1;
}

int ParallelLayout::group_size(Axes axes) const {
  const Mesh mesh = mesh_of(axes);
  int n = 1;
  for (size_t i = 0; i < mesh.axes.size(); ++i) {
    if (axes.has(mesh.axes[i])) n *= mesh.sizes[i];
  }
  return n;
}

ParallelLayout::Mesh ParallelLayout::mesh_of(Axes axes) const {
  bool expert = false, dense = false;
  for (Axis a : {Axis::kData, Axis::kSequence, Axis::kTensor, Axis::kExpertData, Axis::kExpert,
                 Axis::kExpertTensor}) {
    if (!axes.has(a)) continue;
    expert = expert || is_expert(a);
    dense = dense || is_dense_inner(a);
  }
  if (expert && dense) {
    fail(ErrorKind::kInternal,
         "parallel layout: a group over both expert and data/sequence/tensor axes");
  }
  if (expert) {
    return {{Axis::kPipeline, Axis::kExpertData, Axis::kExpert, Axis::kExpertTensor},
            {sizes_.pipeline, expert_data_, sizes_.expert, sizes_.expert_tensor}};
  }
  return {{Axis::kPipeline, Axis::kData, Axis::kSequence, Axis::kTensor},
          {sizes_.pipeline, data_, sizes_.sequence, sizes_.tensor}};
}

std::vector<int> ParallelLayout::coordinates(const Mesh& mesh, int rank) const {
  if (rank < 0 || rank >= world_) {
    fail(ErrorKind::kInternal, "parallel layout: rank {} of a world of {}", rank, world_);
  }
  std::vector<int> out(mesh.sizes.size());
  for (size_t i = mesh.sizes.size(); i-- > 0;) {
    out[i] = rank % mesh.sizes[i];
    rank /= mesh.sizes[i];
  }
  return out;
}

int ParallelLayout::rank_of(const Mesh& mesh, const std::vector<int>& coordinates) const {
  int rank = 0;
  for (size_t i = 0; i < mesh.sizes.size(); ++i) rank = rank * mesh.sizes[i] + coordinates[i];
  return rank;
}

int ParallelLayout::coordinate(Axis axis, int rank) const {
  const Mesh mesh = mesh_of(axis);
  const std::vector<int> c = coordinates(mesh, rank);
  for (size_t i = 0; i < mesh.axes.size(); ++i) {
    if (mesh.axes[i] == axis) return c[i];
  }
  return 0;
}

int ParallelLayout::group_index(Axes axes, int rank) const {
  // The mixed-radix number of the coordinates on the other axes.
  const Mesh mesh = mesh_of(axes);
  const std::vector<int> c = coordinates(mesh, rank);
  int index = 0;
  for (size_t i = 0; i < mesh.axes.size(); ++i) {
    if (!axes.has(mesh.axes[i])) index = index * mesh.sizes[i] + c[i];
  }
  return index;
}

int ParallelLayout::group_rank(Axes axes, int rank) const {
  const Mesh mesh = mesh_of(axes);
  const std::vector<int> c = coordinates(mesh, rank);
  int place = 0;
  for (size_t i = 0; i < mesh.axes.size(); ++i) {
    if (axes.has(mesh.axes[i])) place = place * mesh.sizes[i] + c[i];
  }
  return place;
}

std::vector<int> ParallelLayout::group_ranks(Axes axes, int rank) const {
  const Mesh mesh = mesh_of(axes);
  const std::vector<int> mine = coordinates(mesh, rank);
  std::vector<int> out;
  // Every member's coordinates: this rank's on the other axes, counted through on `axes` with the
  // innermost fastest, which is rank order.
  std::vector<int> c = mine;
  for (size_t i = 0; i < mesh.axes.size(); ++i) {
    if (axes.has(mesh.axes[i])) c[i] = 0;
  }
  const int n = group_size(axes);
  for (int k = 0; k < n; ++k) {
    out.push_back(rank_of(mesh, c));
    for (size_t i = mesh.axes.size(); i-- > 0;) {
      if (!axes.has(mesh.axes[i])) continue;
      if (++c[i] < mesh.sizes[i]) break;
      c[i] = 0;
    }
  }
  return out;
}

std::string ParallelLayout::describe() const {
  std::string out = fmt::format("pipeline {} x data {} x sequence {} x tensor {}", sizes_.pipeline,
                                data_, sizes_.sequence, sizes_.tensor);
  if (sizes_.expert > 1 || sizes_.expert_tensor > 1) {
    out += fmt::format("; experts: data {} x expert {} x tensor {}", expert_data_, sizes_.expert,
                       sizes_.expert_tensor);
  }
  return out + fmt::format(" ({} ranks)", world_);
}

ParallelLayout layout_of(const config::ParallelSection& parallel, int world) {
  Sizes sizes;
  sizes.pipeline = static_cast<int>(parallel.pipeline_parallel_size);
  sizes.sequence = static_cast<int>(parallel.sequence_parallel_size);
  sizes.tensor = static_cast<int>(parallel.tensor_parallel_size);
  sizes.expert = static_cast<int>(parallel.expert_parallel_size);
  return ParallelLayout(world, sizes);
}

}  // namespace dstrain::layout
