#include "zero/engine.h"

#include <cmath>
#include <set>

#include "core/error.h"
#include "zero/grad_reducer.h"
#include "zero/no_decay.h"
#include "zero/stage3.h"

namespace dstrain::zero {
namespace {

std::vector<int64_t> numels_of(const std::vector<NamedParameter>& params) {
  std::vector<int64_t> numels;
  for (const NamedParameter& p : params) numels.push_back(p.tensor.numel());
  return numels;
}

bool is_half(torch::ScalarType dtype) {
  return dtype == torch::kHalf;
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

Engine::Engine(std::vector<NamedParameter> params, comm::Communicator& comm,
               const OptimizerFactory& make_optimizer, EngineOptions options)
    : comm_(comm),
      options_(options),
      partition_(numels_of(params), comm.world_size(), options.reduce_bucket_size),
      scaler_(is_half(options.compute_dtype), options.loss_scaling) {
  validate();
  if (options_.stage == 3) {
    stage3_ = std::make_unique<Stage3Engine>(std::move(params), comm, make_optimizer, options_);
    return;
  }
  std::set<std::string> names;
  for (const NamedParameter& p : params) {
    if (p.frozen) {
      fail(ErrorKind::kInternal, "zero engine: frozen parameter '{}' needs stage 3", p.name);
    }
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
    params_.push_back({p.name, p.tensor.sizes().vec(), p.tensor});
  }
  torch::NoGradGuard no_grad;
  build_master(params);
  build_flat_buffers(params);
  optimizer_ = make_optimizer(master_.numel(), no_decay_ranges());
  if (!optimizer_) fail(ErrorKind::kInternal, "zero engine: the optimizer factory returned null");
  std::vector<torch::Tensor> tensors;
  for (const ParamInfo& p : params_) tensors.push_back(p.tensor);
  reducer_ = std::make_unique<GradReducer>(
      partition_, comm_, tensors,
      GradReducerConfig{options_.stage, options_.overlap_comm, options_.contiguous_gradients});
  if (flat_grad_.defined()) reducer_->set_flat_grad(flat_grad_);
  if (grad_shard_.defined()) reducer_->set_grad_shard(grad_shard_);
  install_hooks();
}

Engine::~Engine() = default;

// The gradient shard (stages 1/2): in the compute dtype beside the parameters, or, offloading the
// optimizer, in fp32 beside the master on the host, streamed there bucket by bucket
// (grad_reducer.h).
torch::TensorOptions Engine::shard_options() const {
  if (options_.offload_optimizer) return master_.options();
  return flat_params_.options();
}

void Engine::validate() const {
  if (options_.stage < 0 || options_.stage > 3) {
    fail(ErrorKind::kConfig, "zero_optimization.stage is {}; expected 0, 1, 2 or 3",
         options_.stage);
  }
  if (options_.offload_param && options_.stage != 3) {
    fail(ErrorKind::kConfig, "offload_param needs zero_optimization.stage 3 (stage is {})",
         options_.stage);
  }
  if (options_.offload_optimizer && options_.stage == 0) {
    fail(ErrorKind::kConfig, "offload_optimizer needs zero_optimization.stage 1, 2 or 3");
  }
  if (options_.gradient_accumulation_steps < 1) {
    fail(ErrorKind::kConfig, "gradient_accumulation_steps is {}; expected >= 1",
         options_.gradient_accumulation_steps);
  }
  if (options_.gradient_clipping < 0) {
    fail(ErrorKind::kConfig, "gradient_clipping is {}; expected >= 0 (0 disables)",
         options_.gradient_clipping);
  }
  const torch::ScalarType dtype = options_.compute_dtype;
  if (dtype != torch::kFloat32 && dtype != torch::kBFloat16 && dtype != torch::kHalf) {
    fail(ErrorKind::kConfig, "compute dtype {} is not supported; expected fp32, bf16 or fp16",
         c10::toString(dtype));
  }
  if (partition_.numel() == 0) fail(ErrorKind::kConfig, "the model has no trainable parameters");
}

// The master is built from the original (fp32) parameter values, before they are cast to the
// compute dtype, so that bf16/fp16 rounding never reaches it.
void Engine::build_master(const std::vector<NamedParameter>& params) {
  const auto options = master_options(params.front().tensor, options_.offload_optimizer);
  const bool alias = options_.stage == 0 && options_.compute_dtype == torch::kFloat32;
  if (alias) return;  // master_ becomes the flat parameter buffer in build_flat_buffers()
  master_ = torch::zeros(
      {options_.stage == 0 ? partition_.padded_numel() : partition_.shard_numel()}, options);
  for (const ParamPiece& piece : master_pieces()) {
    const int64_t n = piece.elements.end - piece.elements.begin;
    master_.narrow(0, master_offset(piece), n)
        .copy_(
            params[piece.param].tensor.detach().reshape({-1}).narrow(0, piece.elements.begin, n));
  }
}

void Engine::build_flat_buffers(const std::vector<NamedParameter>& params) {
  const auto options = params.front().tensor.options().dtype(options_.compute_dtype);
  flat_params_ = torch::zeros({partition_.padded_numel()}, options);
  if (options_.stage < 2) flat_grad_ = torch::zeros({partition_.padded_numel()}, options);
  if (options_.stage == 2) grad_shard_ = torch::zeros({partition_.shard_numel()}, shard_options());
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i].tensor;
    const int64_t offset = partition_.param_offset(i);
    const int64_t n = partition_.param_numel(i);
    flat_params_.narrow(0, offset, n).copy_(p.detach().reshape({-1}));
    p.mutable_grad() = torch::Tensor();
    p.set_data(flat_params_.narrow(0, offset, n).view(params_[i].shape));
    if (flat_grad_.defined())
      p.mutable_grad() = flat_grad_.narrow(0, offset, n).view(params_[i].shape);
  }
  if (!master_.defined()) {
    master_ = flat_params_;
    master_aliases_params_ = true;
  }
}

std::vector<Range> Engine::no_decay_ranges() const {
  std::vector<Range> ranges;
  for (const ParamPiece& piece : master_pieces()) {
    const ParamInfo& p = params_[piece.param];
    if (!takes_no_decay(p.name, static_cast<int64_t>(p.shape.size()))) continue;
    const int64_t begin = master_offset(piece);
    ranges.push_back({begin, begin + piece.elements.end - piece.elements.begin});
  }
  return merge_ranges(std::move(ranges));
}

void Engine::install_hooks() {
  for (size_t i = 0; i < params_.size(); ++i) {
    hooks_.push_back(
        add_post_accumulate_hook(params_[i].tensor, [this, i] { reducer_->on_grad_ready(i); }));
  }
}

// The parameter pieces held in master_: all of them at stage 0, this rank's at stages 1/2.
std::vector<ParamPiece> Engine::master_pieces() const {
  if (options_.stage == 0) return partition_.pieces({0, partition_.padded_numel()});
  return partition_.owned_pieces(comm_.rank());
}

int64_t Engine::master_offset(const ParamPiece& piece) const {
  if (options_.stage == 0) return partition_.param_offset(piece.param) + piece.elements.begin;
  return piece.offset;
}

void Engine::pre_forward(size_t segment) {
  if (stage3_) stage3_->pre_forward(segment);
}

void Engine::post_forward(size_t segment, const torch::Tensor& output) {
  if (stage3_) stage3_->post_forward(segment, output);
}

void Engine::backward(const torch::Tensor& loss) {
  if (stage3_) return stage3_->backward(loss);
  const int steps = options_.gradient_accumulation_steps;
  if (micro_step_ >= steps) {
    fail(ErrorKind::kInternal, "zero engine: backward() called {} times without step()",
         micro_step_ + 1);
  }
  const bool last = micro_step_ == steps - 1;
  const bool communicate = options_.stage == 2 || last;
  if (options_.stage == 1 && last) {
    grad_shard_ = torch::zeros({partition_.shard_numel()}, shard_options());
    reducer_->set_grad_shard(grad_shard_);
  }
  reducer_->begin_backward(communicate, options_.stage == 2 && micro_step_ > 0);
  (loss * (scaler_.scale() / steps)).backward();
  reducer_->end_backward();
  ++micro_step_;
}

}  // namespace dstrain::zero
