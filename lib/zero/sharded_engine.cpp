// ShardedEngine (stages 0-2): construction and backward.
#include "zero/sharded_engine.h"

#include <set>

#include "core/error.h"
#include "zero/grad_reducer.h"

namespace dstrain::zero {
namespace {

// Elements of the trainable parameters, in order: the flat layout.
std::vector<int64_t> numels_of(const std::vector<NamedParameter>& params) {
  std::vector<int64_t> numels;
  for (const NamedParameter& p : params) {
    if (!p.frozen) numels.push_back(p.tensor.numel());
  }
  return numels;
}

// The frozen parameters (a LoRA base) get their initial values in the compute dtype, back to back
// in one buffer of their own in the order given (so that q/k/v weights listed in a row are one
// stacked weight for model/fused_qkv.h): they take no part in the flat buffers, the reduction or
// the update.
void fill_frozen(const std::vector<const NamedParameter*>& frozen, const EngineOptions& options) {
  if (frozen.empty()) return;
  int64_t total = 0;
  for (const NamedParameter* p : frozen) {
    if (p->tensor.requires_grad()) {
      fail(ErrorKind::kInternal, "zero engine: frozen parameter '{}' requires grad", p->name);
    }
    total += p->tensor.numel();
  }
  const torch::Tensor buffer =
      torch::empty({total}, frozen.front()->tensor.options().dtype(options.compute_dtype));
  int64_t at = 0;
  for (const NamedParameter* p : frozen) {
    const int64_t n = p->tensor.numel();
    torch::Tensor values = buffer.narrow(0, at, n).view(p->tensor.sizes());
    values.copy_(initial_elements(*p, options.initial_values, {0, n}).view(p->tensor.sizes()));
    p->tensor.set_data(values);
    at += n;
  }
}

// Where the master shard lives: host memory with offload (pinned when the parameters are on a CUDA
// device, so the per-step copies can be asynchronous), else next to the parameters.
torch::TensorOptions master_options(const torch::Tensor& param, bool offload) {
  auto options = param.options().dtype(torch::kFloat32);
  if (!offload) return options;
  options = options.device(torch::kCPU);
  if (param.is_cuda()) options = options.pinned_memory(true);
  return options;
}

}  // namespace

ShardedEngine::ShardedEngine(std::vector<NamedParameter> params, comm::Communicator& comm,
                             const OptimizerFactory& make_optimizer, EngineOptions options)
    : comm_(comm),
      options_(std::move(options)),
      partition_(numels_of(params), comm.world_size(), options_.reduce_bucket_size) {
  torch::NoGradGuard no_grad;
  std::vector<NamedParameter> trainable;
  std::vector<const NamedParameter*> frozen;
  for (NamedParameter& p : params) {
    if (p.frozen) {
      frozen.push_back(&p);
    } else {
      trainable.push_back(std::move(p));
    }
  }
  fill_frozen(frozen, options_);
  check_params(trainable);
  // Where the parameters live (a stage with nothing to train: its frozen ones).
  const torch::Tensor& any = trainable.empty() ? frozen.front()->tensor : trainable.front().tensor;
  torch::Tensor master = allocate_master(any);
  const auto compute = any.options().dtype(options_.compute_dtype);
  grad_shard_options_ = options_.offload_optimizer ? master.options() : compute;
  allocate_flat_buffers(compute);
  fill_initial_values(trainable, master);
  options_.initial_values = nullptr;  // whatever it holds (open files) is not needed any more
  const bool alias = !master.defined();
  if (alias) master = flat_params_;
  master_ = std::make_unique<MasterState>(std::move(master), alias, master_layout(), make_optimizer,
                                          options_, comm_, flat_params_.device());
  std::vector<torch::Tensor> tensors;
  for (const ParamInfo& p : params_) tensors.push_back(p.tensor);
  reducer_ = std::make_unique<GradReducer>(
      partition_, comm_, tensors,
      GradReducerConfig{options_.stage, options_.overlap_comm, options_.contiguous_gradients});
  reducer_->set_on_reduced([this](size_t bucket) { update_reduced_bucket(bucket); });
  if (flat_grad_.defined()) reducer_->set_flat_grad(flat_grad_);
  if (grad_shard_.defined()) reducer_->set_grad_shard(grad_shard_);
  install_hooks();
}

ShardedEngine::~ShardedEngine() = default;

void ShardedEngine::check_params(const std::vector<NamedParameter>& params) {
  std::set<std::string> names;
  for (const NamedParameter& p : params) {
    if (!p.tensor.defined() || !p.tensor.requires_grad() || !p.tensor.is_leaf()) {
      fail(ErrorKind::kInternal, "zero engine: parameter '{}' is not a leaf that requires grad",
           p.name);
    }
    if (!names.insert(p.name).second) {
      fail(ErrorKind::kInternal, "zero engine: parameter name '{}' appears twice", p.name);
    }
    if (p.tensor.device() != params.front().tensor.device()) {
      fail(ErrorKind::kInternal, "zero engine: parameters on different devices ('{}')", p.name);
    }
    params_.push_back({p.name, p.tensor.sizes().vec(), p.tensor, p.placement});
  }
}

// The fp32 master, zeroed (undefined when it is the flat parameter buffer itself: stage 0 in fp32).
torch::Tensor ShardedEngine::allocate_master(const torch::Tensor& any_param) const {
  const auto options = master_options(any_param, options_.offload_optimizer);
  const bool alias = options_.stage == 0 && options_.compute_dtype == torch::kFloat32;
  if (alias) return torch::Tensor();
  return torch::zeros({options_.stage == 0 ? partition_.padded_numel() : partition_.shard_numel()},
                      options);
}

void ShardedEngine::allocate_flat_buffers(const torch::TensorOptions& compute) {
  flat_params_ = torch::zeros({partition_.padded_numel()}, compute);
  if (options_.stage < 2) flat_grad_ = torch::zeros({partition_.padded_numel()}, compute);
  if (options_.stage == 2) {
    grad_shard_ = torch::zeros({partition_.shard_numel()}, grad_shard_options_);
  }
}

// Reads each parameter's initial values once (one parameter at a time, so that no more than one is
// held beyond the buffers) and copies them into the master and into the flat compute buffer, each
// copy converting from the source's dtype: the master never sees compute-dtype rounding. Then the
// parameter becomes a view of the flat buffer, its .grad one of the flat gradient.
void ShardedEngine::fill_initial_values(const std::vector<NamedParameter>& params,
                                        const torch::Tensor& master) {
  std::vector<std::vector<ParamPiece>> pieces_of(params_.size());
  if (master.defined()) {
    for (const ParamPiece& piece : master_pieces()) pieces_of[piece.param].push_back(piece);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t offset = partition_.param_offset(i);
    const int64_t n = partition_.param_numel(i);
    const torch::Tensor values = initial_elements(params[i], options_.initial_values, {0, n});
    for (const ParamPiece& piece : pieces_of[i]) {
      const int64_t len = piece.elements.end - piece.elements.begin;
      master.narrow(0, master_offset(piece), len)
          .copy_(values.narrow(0, piece.elements.begin, len));
    }
    flat_params_.narrow(0, offset, n).copy_(values);
    torch::Tensor& p = params_[i].tensor;
    p.mutable_grad() = torch::Tensor();
    p.set_data(flat_params_.narrow(0, offset, n).view(params_[i].shape));
    if (flat_grad_.defined())
      p.mutable_grad() = flat_grad_.narrow(0, offset, n).view(params_[i].shape);
  }
}

// What the master holds (stage 0: every parameter, at its flat offset; stages 1/2: this rank's
// chunks, at their shard offset) and what this rank saves: its partition at every stage, so that
// saving is spread over the ranks at stage 0 too.
MasterLayout ShardedEngine::master_layout() const {
  const auto described = [this](const std::vector<ParamPiece>& pieces) {
    std::vector<MasterPiece> out;
    for (const ParamPiece& piece : pieces) {
      const ParamInfo& p = params_[piece.param];
      out.push_back({p.name, p.shape, piece.elements, master_offset(piece), p.placement});
    }
    return out;
  };
  return {described(master_pieces()), described(partition_.owned_pieces(comm_.rank()))};
}

// The parameter pieces held in the master: all of them at stage 0, this rank's at stages 1/2.
std::vector<ParamPiece> ShardedEngine::master_pieces() const {
  if (options_.stage == 0) return partition_.pieces({0, partition_.padded_numel()});
  return partition_.owned_pieces(comm_.rank());
}

// Where a piece sits in the master. At stage 0 the master spans the whole flat buffer: the piece
// is at its flat offset (also for the pieces of owned_pieces(), whose offsets are shard offsets).
int64_t ShardedEngine::master_offset(const ParamPiece& piece) const {
  if (options_.stage == 0) return partition_.param_offset(piece.param) + piece.elements.begin;
  return piece.offset;
}

void ShardedEngine::install_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    hooks_.push_back(
        add_post_accumulate_hook(params_[i].tensor, [this, i] { reducer_->on_grad_ready(i); }));
  }
}

void ShardedEngine::before_autograd(MicroStep micro) {
  const bool stage2 = options_.stage == 2;
  if (options_.stage == 1 && micro.last()) {
    grad_shard_ = torch::zeros({partition_.shard_numel()}, grad_shard_options_);
    reducer_->set_grad_shard(grad_shard_);
  }
  master_->arm_backward_update(micro.last() ? step_lr() : std::nullopt);
  reducer_->begin_backward(/*communicate=*/stage2 || micro.last(),
                           /*accumulate=*/stage2 && !micro.first(),
                           /*notify=*/master_->backward_update_armed());
}

void ShardedEngine::after_autograd() {
  reducer_->end_backward();
}

}  // namespace dstrain::zero
