#include "train/tensor_parallel.h"

#include <algorithm>
#include <functional>
#include <map>
#include <vector>

#include "comm/autograd.h"
#include "core/error.h"
#include "lora/lora_model.h"

namespace dstrain::train {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// x [..., k] of every rank → [..., T·k]; backward: this rank's slice of the gradient (the ranks
// compute the same thing from the gathered tensor, so each takes its own part, Megatron's
// gather-from-region).
struct GatherLast : torch::autograd::Function<GatherLast> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               comm::Communicator* comm) {
    const int64_t k = x.size(-1), T = comm->world_size();
    ctx->saved_data["k"] = k;
    ctx->saved_data["rank"] = static_cast<int64_t>(comm->rank());
    const torch::Tensor input = x.detach().movedim(-1, 0).contiguous();
    std::vector<int64_t> shape = input.sizes().vec();
    shape[0] *= T;
    torch::Tensor output = torch::empty(shape, input.options());
    torch::Tensor flat = output.view({-1});  // the communicators take flat buffers
    comm->all_gather(flat, input.view({-1}))->wait();
    return output.movedim(0, -1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t k = ctx->saved_data["k"].toInt(), r = ctx->saved_data["rank"].toInt();
    return {grads[0].narrow(-1, r * k, k).contiguous(), torch::Tensor()};
  }
};

using WholeRange = std::function<torch::Tensor(int64_t begin, int64_t end)>;

// Elements [begin, end) of this rank's slice (`shape`, placed as `placed`, cut as `cuts` says) of a
// parameter, from
// `whole`, the whole parameter's flat ranges: a slice along dimension 0 is one range of it, along
// a later dimension d a segment of each of its rows of the whole shape viewed as
// [shape[0]·…·shape[d−1], the rest] (read in blocks of rows), a replicated parameter the range
// itself.
torch::Tensor read_slice(const WholeRange& whole, const PlacedShape& placed,
                         const PlacementCuts& cuts, int64_t begin, int64_t end) {
  if (placed.placement.replicated()) return whole(begin, end);
  const auto [T, r] = cuts.of(placed.placement);
  const std::vector<int64_t>& shape = placed.shape;
  const auto dim = static_cast<size_t>(placed.placement.dim());
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (dim == 0) return whole(r * numel + begin, r * numel + end);
  // A column slice of a [rows, T·cols] matrix: each row's cols elements from r·cols on.
  int64_t cols = 1;
  for (size_t d = dim; d < shape.size(); ++d) cols *= shape[d];
  const int64_t width = T * cols;
  constexpr int64_t kReadElements = int64_t{16} << 20;
  const int64_t rows_per_read = std::max<int64_t>(1, kReadElements / width);
  std::vector<torch::Tensor> parts;
  for (int64_t row = begin / cols; row * cols < end; row += rows_per_read) {
    const int64_t last = std::min((end + cols - 1) / cols, row + rows_per_read);
    const torch::Tensor block =
        whole(row * width, last * width).view({last - row, width}).narrow(1, r * cols, cols);
    const int64_t lo = std::max(begin, row * cols), hi = std::min(end, last * cols);
    parts.push_back(block.reshape({-1}).narrow(0, lo - row * cols, hi - lo));
  }
  return parts.size() == 1 ? parts[0] : torch::cat(parts);
}

// A saved state read through one rank's slices (WholeCoordinateState::restore_state).
class SliceStateIn final : public ckpt::StateIn {
 public:
  SliceStateIn(const ckpt::StateIn& in, const PlacedShapes& shapes, const PlacementCuts& cuts)
      : in_(in), shapes_(shapes), cuts_(cuts) {}
  int version() const override { return in_.version(); }
  const nlohmann::json& json() const override { return in_.json(); }
  torch::Tensor read(const std::string& kind, const std::string& param, int64_t begin,
                     int64_t end) const override {
    const auto it = shapes_.find(param);
    if (it == shapes_.end()) return in_.read(kind, param, begin, end);
    return read_slice([&](int64_t b, int64_t e) { return in_.read(kind, param, b, e); }, it->second,
                      cuts_, begin, end);
  }
  // The whole shapes as this rank's slices of them.
  std::vector<std::pair<std::string, std::vector<int64_t>>> params(
      const std::string& kind) const override {
    auto out = in_.params(kind);
    for (auto& [name, shape] : out) {
      const auto it = shapes_.find(name);
      if (it == shapes_.end() || it->second.placement.replicated()) continue;
      const auto dim = static_cast<size_t>(it->second.placement.dim());
      const int64_t T = cuts_.of(it->second.placement).size;
      if (dim < shape.size() && shape[dim] % T == 0) shape[dim] /= T;
    }
    return out;
  }
  torch::Tensor rank_tensor(const std::string& name) const override {
    return in_.rank_tensor(name);
  }
  const std::string& origin() const override { return in_.origin(); }

 private:
  const ckpt::StateIn& in_;
  const PlacedShapes& shapes_;
  PlacementCuts cuts_;
};

class Shapes final : public model::TensorParallel {
 public:
  Shapes(int size, bool sequence_parallel) : size_(size), sequence_parallel_(sequence_parallel) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  bool sequence_parallel() const override { return sequence_parallel_; }
  torch::Tensor enter(const torch::Tensor&) override { refuse(); }
  torch::Tensor leave(const torch::Tensor&) override { refuse(); }
  torch::Tensor gather_rows(const torch::Tensor&) override { refuse(); }
  torch::Tensor reduce_scatter_rows(const torch::Tensor&) override { refuse(); }
  torch::Tensor gather_last(const torch::Tensor&) override { refuse(); }
  void all_reduce_(torch::Tensor&, bool) override { refuse(); }

 private:
  [[noreturn]] static void refuse() {
    fail(ErrorKind::kInternal, "a model built for its shapes alone ran a tensor-parallel forward");
  }
  int size_;
  bool sequence_parallel_;
};

}  // namespace

TensorParallelGroup::TensorParallelGroup(comm::Communicator* group, comm::Communicator& replicas,
                                         bool sequence_parallel)
    : group_(group),
      replicas_(replicas),
      size_(group ? group->world_size() : 1),
      rank_(group ? group->rank() : 0),
      sequence_parallel_(sequence_parallel && size_ > 1) {}

comm::Communicator& TensorParallelGroup::group() {
  if (!group_) fail(ErrorKind::kInternal, "tensor parallelism: a group of one has no collectives");
  return *group_;
}

torch::Tensor TensorParallelGroup::enter(const torch::Tensor& x) {
  return comm::enter_parallel(group(), x);
}

torch::Tensor TensorParallelGroup::leave(const torch::Tensor& x) {
  return comm::leave_parallel(group(), x);
}

torch::Tensor TensorParallelGroup::gather_rows(const torch::Tensor& x) {
  return comm::gather_rows(group(), x);
}

torch::Tensor TensorParallelGroup::reduce_scatter_rows(const torch::Tensor& x) {
  return comm::reduce_scatter_rows(group(), x);
}

torch::Tensor TensorParallelGroup::gather_last(const torch::Tensor& x) {
  return GatherLast::apply(x, &group());
}

torch::Tensor TensorParallelGroup::whole(const torch::Tensor& local,
                                         const model::Placement& placement) {
  if (size_ == 1) return local;
  // Each rank's slice in its place of a zeroed whole tensor, summed over the group.
  std::vector<int64_t> sizes = local.sizes().vec();
  torch::Tensor out;
  if (placement.replicated()) {
    out = rank_ == 0 ? local.contiguous().clone() : torch::zeros_like(local);
  } else {
    const int dim = placement.dim();
    const int64_t n = sizes.at(static_cast<size_t>(dim));
    sizes[static_cast<size_t>(dim)] = n * size_;
    out = torch::zeros(sizes, local.options());
    out.narrow(dim, rank_ * n, n).copy_(local);
  }
  group().all_reduce(out, comm::ReduceOp::kSum)->wait();
  return out;
}

torch::Tensor TensorParallelGroup::whole_gradient(const torch::Tensor& local,
                                                  const model::Placement& placement) {
  if (size_ == 1 || !placement.partial_gradient) return whole(local, placement);
  torch::Tensor out = local.contiguous().clone();
  group().all_reduce(out, comm::ReduceOp::kSum)->wait();
  return out;
}

void TensorParallelGroup::all_reduce_(torch::Tensor& x, bool max) {
  if (!x.is_contiguous()) fail(ErrorKind::kInternal, "tensor parallelism: all_reduce_ of a view");
  group().all_reduce(x, max ? comm::ReduceOp::kMax : comm::ReduceOp::kSum)->wait();
}

std::shared_ptr<model::TensorParallel> tensor_parallel_shapes(int size, bool sequence_parallel) {
  return std::make_shared<Shapes>(size, sequence_parallel && size > 1);
}

PlacedShapes placed_shapes(const model::DecoderModelImpl& model, const lora::LoraModel* lora) {
  PlacedShapes out;
  for (const auto& block : model.blocks()) {
    for (const model::BlockParameter& p : block->parameters) {
      out[p.name] = {p.tensor.sizes().vec(), p.placement};
    }
  }
  if (lora == nullptr) return out;
  for (const lora::LoraModel::BlockParameter& p : lora->block_parameters()) {
    out[p.name] = {p.tensor.sizes().vec(), p.placement};
  }
  return out;
}

PlacementCuts::Cut PlacementCuts::of(const model::Placement& placement) const {
  return placement.group == model::PlacementGroup::kExpert ? expert : tensor;
}

PlacementCuts placement_cuts(const model::DecoderModelImpl& model,
                             const model::TensorParallel& tp) {
  PlacementCuts cuts;
  cuts.tensor = {tp.size(), tp.rank()};
  if (const model::ExpertParallel* ep = model.expert_parallel())
    cuts.expert = {ep->size(), ep->rank()};
  return cuts;
}

model::ValueSource slice_source(model::ValueSource whole, const model::DecoderModelImpl& model,
                                const model::TensorParallel& tp) {
  return [whole = std::move(whole), shapes = placed_shapes(model, nullptr),
          cuts = placement_cuts(model, tp)](const std::string& name, int64_t begin, int64_t end) {
    return read_slice([&](int64_t b, int64_t e) { return whole(name, b, e); }, shapes.at(name),
                      cuts, begin, end);
  };
}

WholeCoordinateState::WholeCoordinateState(ckpt::Stateful& engine,
                                           const model::DecoderModelImpl& model,
                                           const lora::LoraModel* lora,
                                           const model::TensorParallel& tp)
    : engine_(engine), shapes_(placed_shapes(model, lora)), cuts_(placement_cuts(model, tp)) {}

ckpt::State WholeCoordinateState::snapshot_state(ckpt::Snapshot how) const {
  ckpt::State state = engine_.snapshot_state(how);
  std::vector<ckpt::Piece> pieces;
  for (ckpt::Piece& p : state.pieces) {
    const model::Placement& placement = shapes_.at(p.param).placement;
    const auto [size, rank] = cuts_.of(placement);
    if (placement.replicated()) {
      // Every rank of the group holds it: its rank 0 saves it, so each element is saved once.
      if (rank == 0) pieces.push_back(std::move(p));
      continue;
    }
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    const int dim = placement.dim();
    if (dim == 0) {
      p.begin += rank * numel;
      p.end += rank * numel;
    } else if (dim == 1 && p.shape.size() == 2) {
      p.columns = ckpt::Columns{rank * p.shape.at(1), p.shape.at(1)};
    } else {
      fail(ErrorKind::kInternal, "checkpoint: {} is split along dimension {} of {}", p.param, dim,
           p.shape.size());
    }
    p.shape.at(static_cast<size_t>(dim)) *= size;
    pieces.push_back(std::move(p));
  }
  state.pieces = std::move(pieces);
  return state;
}

void WholeCoordinateState::restore_state(const ckpt::StateIn& in) {
  engine_.restore_state(SliceStateIn(in, shapes_, cuts_));
}

void check_tensor_parallel_length(int64_t max_length, int sequence_parallel, int size,
                                  bool tensor_sequence_parallel) {
  if (size <= 1 || !tensor_sequence_parallel) return;
  if ((max_length / sequence_parallel) % size != 0) {
    fail(ErrorKind::kConfig,
         "data.max_length ({}) / parallel.sequence_parallel_size ({}) is not divisible by "
         "parallel.tensor_parallel_size ({}) with parallel.tensor_sequence_parallel: each rank of "
         "a tensor-parallel group keeps "
         "an equal share of every micro-batch's token rows between the layers",
         max_length, sequence_parallel, size);
  }
}

}  // namespace dstrain::train
