#include "model/layer_graphs.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>

#include "core/error.h"
#include "core/log.h"
#include "model/kernel_check.h"
#include "model/rng_state.h"

#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dstrain::model {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// The RoPE tables of one input shape at a fixed address: copied from a forward's context when it
// brings other tensors (held, so that identity means the same values).
struct StaticContext {
  BlockContext ctx;
  torch::Tensor cos_source, sin_source;

  void fill(const BlockContext& from) {
    torch::NoGradGuard no_grad;
    ctx.training = true;
    copy(from.cos, ctx.cos, cos_source);
    copy(from.sin, ctx.sin, sin_source);
  }

 private:
  static void copy(const torch::Tensor& from, torch::Tensor& to, torch::Tensor& source) {
    if (!from.defined()) return;  // a block without RoPE
    if (!to.defined()) {
      to = from.clone();
    } else if (!source.is_same(from)) {
      to.copy_(from);
    }
    source = from;
  }
};

// One layer's recordings for one input shape, with the static buffers they read and write.
struct Slot {
  bool grad = false;  // recorded under grad: a backward recording too (when the output needs one)
  bool input_requires_grad = false;
  torch::Tensor x;          // [B, T, C] the input buffer
  torch::Tensor out;        // [B, T, C] the output buffer (no autograd history)
  torch::Tensor graph_out;  // the recorded forward's output, with the autograd graph it recorded
  torch::Tensor grad_out;   // [B, T, C] the output gradient buffer
  std::vector<torch::Tensor> leaves;  // parameters the forward reached that require grad
  std::vector<torch::Tensor> grads;  // gradient buffers: the input's (if it requires grad), leaves'
  std::unique_ptr<Recording> forward, backward;
  StaticContext* context = nullptr;  // the RoPE tables its recordings read
  // What the recordings read in place, with where it was at recording time: the block's
  // parameters and the leaves.
  std::vector<std::pair<torch::Tensor, const void*>> reads;
  std::vector<std::string> read_names;
  bool backward_pending = false;  // its forward replayed, its backward not yet

  // The name of a read that is no longer where it was recorded, "" when none moved.
  std::string moved() const {
    for (size_t i = 0; i < reads.size(); ++i) {
      if (reads[i].first.data_ptr() != reads[i].second) return read_names[i];
    }
    return "";
  }
};

// Parameters (autograd leaves that require grad) reached from `out`'s graph, in a fixed order;
// `input` itself excluded.
std::vector<torch::Tensor> leaves_of(const torch::Tensor& out, const torch::Tensor& input) {
  std::vector<torch::Tensor> leaves;
  std::unordered_set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  if (out.grad_fn()) todo.push_back(out.grad_fn().get());
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& edge : node->next_edges()) {
      if (!edge.is_valid()) continue;
      auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(edge.function.get());
      if (acc == nullptr) {
        todo.push_back(edge.function.get());
      } else if (!acc->variable.is_same(input) && seen.insert(acc).second) {
        leaves.push_back(acc->variable);
      }
    }
  }
  return leaves;
}

// Writes `value` into the buffer `dst`, which the first (recording) run creates.
void keep(torch::Tensor& dst, const torch::Tensor& value) {
  if (!dst.defined() || !value.defined()) {
    dst = value;
  } else {
    dst.copy_(value);
  }
}

void forward_body(Slot& s, Block& block, const BlockContext& ctx) {
  torch::AutoGradMode mode(s.grad);
  torch::Tensor o = block.forward(s.x, ctx);
  torch::NoGradGuard no_grad;
  keep(s.out, o.detach());
  s.graph_out = o;
}

variable_list gradient_inputs(const Slot& s) {
  variable_list inputs;
  if (s.input_requires_grad) inputs.push_back(s.x);
  inputs.insert(inputs.end(), s.leaves.begin(), s.leaves.end());
  return inputs;
}

// `retain`: keep the forward's saved activations (they must stay where the recording read them).
void backward_body(Slot& s, bool retain) {
  const variable_list grads = torch::autograd::grad({s.graph_out}, gradient_inputs(s), {s.grad_out},
                                                    retain, /*create_graph=*/false,
                                                    /*allow_unused=*/true);
  torch::NoGradGuard no_grad;
  s.grads.resize(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) keep(s.grads[i], grads[i]);
}

// The eager run a recording is checked against: the output and, with a backward, the gradients
// of gradient_inputs() (by tensor) for the output gradient `seed`.
struct EagerRun {
  torch::Tensor out;
  std::map<const c10::TensorImpl*, torch::Tensor> grads;
};

EagerRun eager_run(const Slot& s, Block& block, const BlockContext& ctx,
                   const torch::Tensor& seed) {
  torch::AutoGradMode mode(s.grad);
  const torch::Tensor o = block.forward(s.x, ctx);
  EagerRun r;
  r.out = o.detach();
  if (!s.grad || !o.requires_grad()) return r;
  Slot probe;
  probe.input_requires_grad = s.input_requires_grad;
  probe.x = s.x;
  probe.leaves = leaves_of(o, s.x);
  const variable_list inputs = gradient_inputs(probe);
  if (inputs.empty()) return r;
  const variable_list grads =
      torch::autograd::grad({o}, inputs, {seed.to(o.options())}, false, false, true);
  for (size_t i = 0; i < inputs.size(); ++i) r.grads[inputs[i].unsafeGetTensorImpl()] = grads[i];
  return r;
}

// The worst tensor of a first-use check (see layer_graphs.h for the bound).
struct CheckResult {
  bool passed = true;
  double error = 0, bound = 0, ratio = -1;
  std::string tensor;

  void add(const std::string& name, const torch::Tensor& replayed, const torch::Tensor& eager,
           const torch::Tensor& eager_again) {
    if (!replayed.defined() && !eager.defined()) return;
    auto as_double = [&](const torch::Tensor& t, const torch::Tensor& like) {
      return t.defined() ? t.detach().to(torch::kDouble) : torch::zeros_like(like, torch::kDouble);
    };
    const torch::Tensor like = eager.defined() ? eager : replayed;
    const torch::Tensor e = as_double(eager, like), r = as_double(replayed, like),
                        a = as_double(eager_again, like);
    const double err = (r - e).abs().max().item<double>();
    const double spread = (a - e).abs().max().item<double>();
    const double b = 2 * spread + 4 * dtype_eps(like.scalar_type()) * e.abs().max().item<double>();
    const bool ok = std::isfinite(err) && err <= b;
    const double q = !ok && (!std::isfinite(err) || b == 0)
                         ? std::numeric_limits<double>::infinity()
                     : b > 0 ? err / b
                             : 0.0;
    passed = passed && ok;
    if (q > ratio) {
      ratio = q;
      error = err;
      bound = b;
      tensor = name;
    }
  }
};

// The first line of an exception's message (c10 errors append a backtrace).
std::string first_line(const char* what) {
  std::string s(what);
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

}  // namespace

struct LayerGraphs::State {
  std::shared_ptr<Recorder> recorder;
  LayerGraphOptions options;
  bool enabled = true;
  LayerGraphStats stats;
  // (layer, grad, input requires grad, shape, dtype) → its slot; null: eager for good.
  using Key = std::tuple<size_t, bool, bool, std::vector<int64_t>, int>;
  std::map<Key, std::shared_ptr<Slot>> slots;
  std::map<std::pair<std::vector<int64_t>, int>, int> pools;  // input shape and dtype → pool
  std::map<int, StaticContext> contexts;                      // pool → its RoPE tables
  bool shapes_exceeded_logged = false;
  bool speed_judged = false;             // options.min_speedup applied
  std::set<size_t> eager_layers;         // for good, on this rank
  std::vector<LayerFallback> fallbacks;  // not yet taken
  std::map<size_t, std::string> names;   // block index → name, of the blocks seen

  std::shared_ptr<Slot> slot_for(const ModelBlock& block, const torch::Tensor& x,
                                 const BlockContext& ctx);
  int pool_for(const torch::Tensor& x);
  std::shared_ptr<Slot> record(const ModelBlock& block, const torch::Tensor& x, bool grad,
                               StaticContext& sctx, int pool);
  // The first-use check of `s`'s recordings against the eager runs `first` and `again`.
  CheckResult check(Slot& s, const ModelBlock& block, const EagerRun& first, const EagerRun& again,
                    const torch::Tensor& seed);
  void fall_back(LayerFallback f);
  // options.min_speedup, once the first recordings are timed.
  void judge_speed();
};

namespace {

// What the autograd node of a replayed layer holds.
struct SlotHandle : torch::CustomClassHolder {
  std::shared_ptr<LayerGraphs::State> state;
  std::shared_ptr<Slot> slot;  // kept alive for the backward, even after run_eagerly()
};

// A replayed layer in the autograd graph, its forward already replayed (outside Function::apply,
// whose forward runs with autograd's dispatch keys excluded: the replaying recorder records a
// graph). Inputs: the layer input, then the slot's leaves (so that autograd routes their
// gradients to their accumulators). The gradients returned are the slot's buffers themselves: the
// slot holds a reference, so autograd copies them into .grad instead of taking them over (a buffer
// is overwritten by the next replay).
class ReplayedLayer : public torch::autograd::Function<ReplayedLayer> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, c10::intrusive_ptr<SlotHandle> handle,
                               at::TensorList /*inputs*/) {
    torch::Tensor out = handle->slot->out.detach();  // a new alias: this call's node goes on it
    ctx->saved_data["slot"] = c10::IValue::make_capsule(std::move(handle));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto handle =
        c10::static_intrusive_pointer_cast<SlotHandle>(ctx->saved_data["slot"].toCapsule());
    Slot& s = *handle->slot;
    s.backward_pending = false;
    if (grads[0].defined()) {
      s.grad_out.copy_(grads[0]);
    } else {
      s.grad_out.zero_();
    }
    s.backward->replay();
    ++handle->state->stats.replays;
    variable_list result{torch::Tensor()};  // the handle
    size_t g = 0;
    result.push_back(s.input_requires_grad ? s.grads[g++] : torch::Tensor());
    for (size_t i = 0; i < s.leaves.size(); ++i) result.push_back(s.grads[g++]);
    return result;
  }
};

}  // namespace

int LayerGraphs::State::pool_for(const torch::Tensor& x) {
  const auto shape = std::make_pair(x.sizes().vec(), static_cast<int>(x.scalar_type()));
  const auto it = pools.find(shape);
  if (it != pools.end()) return it->second;
  if (static_cast<int>(pools.size()) >= options.max_shapes) {
    if (!shapes_exceeded_logged) {
      log::info("CUDA graphs: more than {} input shapes; layers run eagerly for the others",
                options.max_shapes);
      shapes_exceeded_logged = true;
    }
    return -1;
  }
  const int id = static_cast<int>(pools.size());
  pools.emplace(shape, id);
  return id;
}

std::shared_ptr<Slot> LayerGraphs::State::slot_for(const ModelBlock& block, const torch::Tensor& x,
                                                   const BlockContext& ctx) {
  const bool grad = torch::GradMode::is_enabled();
  Key key{block.index, grad, grad && x.requires_grad(), x.sizes().vec(),
          static_cast<int>(x.scalar_type())};
  const auto it = slots.find(key);
  if (it != slots.end()) return it->second;
  names.try_emplace(block.index, block.name);  // once per layer and shape, not per call
  if (!stats.failure.empty()) return nullptr;
  if (options.pool_budget > 0) {
    if (const int64_t held = recorder->pool_bytes(); held > options.pool_budget) {
      stats.failure =
          fmt::format("the pools hold {} bytes, over the budget of {}", held, options.pool_budget);
      log::warn(
          "CUDA graphs: their memory pools hold {:.1f} MiB, over the {:.1f} MiB the memory plan "
          "allows them; {} and every layer not recorded yet run eagerly from now on",
          static_cast<double>(held) / (1 << 20),
          static_cast<double>(options.pool_budget) / (1 << 20), block.name);
      return nullptr;
    }
  }
  const int pool = pool_for(x);
  if (pool < 0) return nullptr;
  StaticContext& sctx = contexts[pool];
  sctx.fill(ctx);
  std::shared_ptr<Slot> slot = record(block, x, grad, sctx, pool);
  if (slot) slot->context = &sctx;
  slots.emplace(std::move(key), slot);
  return slot;
}

std::shared_ptr<Slot> LayerGraphs::State::record(const ModelBlock& block, const torch::Tensor& x,
                                                 bool grad, StaticContext& sctx, int pool) {
  auto slot = std::make_shared<Slot>();
  Slot* s = slot.get();
  s->grad = grad;
  s->input_requires_grad = grad && x.requires_grad();
  {
    torch::NoGradGuard no_grad;
    s->x = x.detach().clone();
  }
  s->x.requires_grad_(s->input_requires_grad);
  const BlockContext* ctx = &sctx.ctx;
  const std::shared_ptr<Block> layer = block.block;
  const RngState rng = capture_rng({x});
  // The check's output gradient, from a generator of its own (the run's stay untouched).
  const torch::Tensor seed = torch::randn(
      x.sizes(), at::make_generator<at::CPUGeneratorImpl>(0x6ea9u + block.index), torch::kFloat);
  try {
    // The warm-up (lazy initialisations, outside any recording) is the eager run checked against.
    EagerRun first;
    recorder->warm_up([&] { first = eager_run(*s, *layer, *ctx, seed); });
    restore_rng(rng);
    EagerRun again;
    const double eager_seconds = recorder->time([&] { again = eager_run(*s, *layer, *ctx, seed); });
    restore_rng(rng);
    s->forward = recorder->record([s, layer, ctx] { forward_body(*s, *layer, *ctx); }, pool);
    ++stats.recordings;
    if (grad && s->graph_out.requires_grad()) {
      s->leaves = leaves_of(s->graph_out, s->x);
      {
        torch::NoGradGuard no_grad;
        s->grad_out = torch::zeros_like(s->out);
      }
      const bool retain = !options.recompute_follows;
      s->backward = recorder->record([s, retain] { backward_body(*s, retain); }, pool);
      ++stats.recordings;
    }
    restore_rng(rng);
    const CheckResult checked = check(*s, block, first, again, seed);
    restore_rng(rng);
    if (!checked.passed) {
      fall_back({block.index, FallbackCause::kReplayDiffers, checked.error, checked.bound,
                 checked.tensor});
      return nullptr;
    }
    // The same work replayed (the check's replays were the recordings' first).
    stats.first_use_replay_seconds += recorder->time([&] {
      s->forward->replay();
      if (s->backward) s->backward->replay();
    });
    stats.first_use_eager_seconds += eager_seconds;
    restore_rng(rng);
    for (const BlockParameter& p : block.parameters) {
      s->reads.emplace_back(p.tensor, p.tensor.data_ptr());
      s->read_names.push_back(p.name);
    }
    for (const torch::Tensor& t : s->leaves) {
      s->reads.emplace_back(t, t.data_ptr());
      s->read_names.push_back("an adapter of " + block.name);
    }
    return slot;
  } catch (const std::exception& e) {
    restore_rng(rng);
    stats.failure = fmt::format("{}: {}", block.name, first_line(e.what()));
    log::warn(
        "CUDA graphs: recording {} failed ({}); it and every layer not recorded yet run eagerly "
        "from now on (training.cuda_graphs: off avoids the attempt)",
        block.name, first_line(e.what()));
    return nullptr;
  }
}

CheckResult LayerGraphs::State::check(Slot& s, const ModelBlock& block, const EagerRun& first,
                                      const EagerRun& again, const torch::Tensor& seed) {
  s.forward->replay();
  CheckResult r;
  r.add("output", s.out, first.out, again.out);
  if (!s.backward) return r;
  {
    torch::NoGradGuard no_grad;
    s.grad_out.copy_(seed);
  }
  s.backward->replay();
  std::map<const c10::TensorImpl*, std::string> names;
  for (const BlockParameter& p : block.parameters) names[p.tensor.unsafeGetTensorImpl()] = p.name;
  const variable_list inputs = gradient_inputs(s);
  for (size_t i = 0; i < inputs.size(); ++i) {
    const c10::TensorImpl* id = inputs[i].unsafeGetTensorImpl();
    const auto named = names.find(id);
    const std::string name = s.input_requires_grad && i == 0 ? "the input's gradient"
                             : named != names.end()          ? named->second + "'s gradient"
                                                             : "an adapter's gradient";
    const auto e = first.grads.find(id), a = again.grads.find(id);
    r.add(name, s.grads[i], e == first.grads.end() ? torch::Tensor() : e->second,
          a == again.grads.end() ? torch::Tensor() : a->second);
  }
  return r;
}

void LayerGraphs::State::fall_back(LayerFallback f) {
  if (!eager_layers.insert(f.layer).second) return;
  stats.eager_layers = static_cast<int64_t>(eager_layers.size());
  fallbacks.push_back(std::move(f));
}

LayerGraphs::LayerGraphs(std::shared_ptr<Recorder> recorder, LayerGraphOptions options)
    : state_(std::make_shared<State>()) {
  state_->recorder = std::move(recorder);
  state_->options = options;
}

LayerGraphs::~LayerGraphs() = default;

void LayerGraphs::set_enabled(bool enabled) {
  state_->enabled = enabled;
}

LayerGraphStats LayerGraphs::stats() const {
  return state_->stats;
}

int64_t LayerGraphs::pool_bytes() const {
  return state_->recorder->pool_bytes();
}

void LayerGraphs::State::judge_speed() {
  if (options.min_speedup <= 0 || speed_judged || stats.first_use_replay_seconds <= 0) return;
  speed_judged = true;
  if (stats.first_use_eager_seconds >= options.min_speedup * stats.first_use_replay_seconds) {
    return;
  }
  for (const auto& [key, slot] : slots) {
    if (slot == nullptr) continue;
    fall_back({std::get<0>(key), FallbackCause::kNoGain, stats.first_use_replay_seconds,
               stats.first_use_eager_seconds / options.min_speedup, ""});
  }
}

std::vector<LayerFallback> LayerGraphs::take_fallbacks() {
  state_->judge_speed();
  return std::exchange(state_->fallbacks, {});
}

void LayerGraphs::run_eagerly(const std::vector<size_t>& layers) {
  State& st = *state_;
  for (size_t layer : layers) st.eager_layers.insert(layer);
  st.stats.eager_layers = static_cast<int64_t>(st.eager_layers.size());
  for (auto it = st.slots.begin(); it != st.slots.end();) {
    it = st.eager_layers.count(std::get<0>(it->first)) != 0 ? st.slots.erase(it) : std::next(it);
  }
}

std::string LayerGraphs::block_name(size_t index) const {
  const auto it = state_->names.find(index);
  return it == state_->names.end() ? fmt::format("block {}", index) : it->second;
}

std::string fallback_cause_text(FallbackCause cause) {
  switch (cause) {
    case FallbackCause::kReplayDiffers:
      return "its replay differed from the eager run";
    case FallbackCause::kParameterMoved:
      return "a parameter it reads moved after recording";
    case FallbackCause::kSecondForward:
      return "it ran a second forward before the backward of the first";
    case FallbackCause::kNoGain:
      return "its replays were not faster than its eager runs by the margin required";
  }
  return "";
}

BlockWrapper LayerGraphs::wrapper() {
  return [state = state_](const ModelBlock& block, const torch::Tensor& x, const BlockContext& ctx,
                          const BlockFn& run) -> torch::Tensor {
    // Packed documents change from one batch to the next inside the layer (its attention's
    // pieces, the per-row RoPE tables): a recording of one batch would replay its documents.
    if (block.role != BlockRole::kLayer || !ctx.training || !state->enabled || ctx.documents) {
      return run(x);
    }
    std::shared_ptr<Slot> slot;
    if (state->recorder->supports(x) && state->eager_layers.count(block.index) == 0) {
      slot = state->slot_for(block, x, ctx);
    }
    if (slot != nullptr) {
      if (std::string moved = slot->moved(); !moved.empty()) {
        state->fall_back({block.index, FallbackCause::kParameterMoved, 0, 0, std::move(moved)});
        slot = nullptr;
      } else if (slot->backward_pending) {
        // Its pending backward replays from activations this call would overwrite.
        state->fall_back({block.index, FallbackCause::kSecondForward, 0, 0, ""});
        slot = nullptr;
      }
    }
    if (slot == nullptr) {
      ++state->stats.eager_calls;
      return run(x);
    }
    slot->context->fill(ctx);
    {
      torch::NoGradGuard no_grad;
      slot->x.copy_(x);
    }
    slot->forward->replay();
    ++state->stats.replays;
    if (!slot->backward) return slot->out.detach();
    slot->backward_pending = true;
    auto handle = c10::make_intrusive<SlotHandle>();
    handle->state = state;
    handle->slot = slot;
    variable_list inputs{x};
    inputs.insert(inputs.end(), slot->leaves.begin(), slot->leaves.end());
    return ReplayedLayer::apply(std::move(handle), at::TensorList(inputs));
  };
}

// ---------------------------------------------------------------------------------------------
// Recorders.

double Recorder::time(const std::function<void()>& fn) {
  synchronize();
  const auto start = std::chrono::steady_clock::now();
  fn();
  synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

namespace {

class ReplayingRecording final : public Recording {
 public:
  explicit ReplayingRecording(std::function<void()> body) : body_(std::move(body)) {}
  void replay() override { body_(); }

 private:
  std::function<void()> body_;
};

class ReplayingRecorder final : public Recorder {
 public:
  bool supports(const torch::Tensor&) const override { return true; }
  void warm_up(const std::function<void()>& body) override { body(); }
  std::unique_ptr<Recording> record(const std::function<void()>& body, int) override {
    body();
    return std::make_unique<ReplayingRecording>(body);
  }
};

}  // namespace

std::shared_ptr<Recorder> replaying_recorder() {
  return std::make_shared<ReplayingRecorder>();
}

#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA

namespace {

// A CUDA graph that can undo a failed capture: the stream's capture ended, the allocators routed
// back from the graph's pool, which is released, and the generators out of capture mode.
class Graph final : public at::cuda::CUDAGraph {
 public:
  void abort() noexcept {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(capture_stream_.stream(), &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(capture_stream_.stream(), &partial) == cudaSuccess && partial) {
        cudaGraphDestroy(partial);
      }
    }
    (void)cudaGetLastError();  // capture errors are not sticky: clear the one left
    if (capture_ended_ || capture_dev_ == UNDEFINED_DEVICE) return;
    quietly([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(capture_dev_, mempool_id_); });
    quietly([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(mempool_id_); });
    // What capture_epilogue() does (not exported): the generator leaves capture mode, else its
    // next eager draw fails.
    for (auto& [state, increment] : captured_generator_states_) {
      state->capturing_ = false;
      increment = state->offset_intragraph_;
    }
    quietly([&] { c10::cuda::CUDACachingAllocator::releasePool(capture_dev_, mempool_id_); });
    quietly([&] { at::getHostAllocator(at::kCUDA)->release_pool(mempool_id_); });
  }

 private:
  template <typename Fn>
  static void quietly(Fn&& fn) noexcept {
    try {
      fn();
    } catch (...) {  // already done by the part of capture_end() that ran
    }
  }
};

class GraphRecording final : public Recording {
 public:
  explicit GraphRecording(std::unique_ptr<Graph> graph) : graph_(std::move(graph)) {}
  void replay() override { graph_->replay(); }

 private:
  std::unique_ptr<Graph> graph_;
};

class CudaGraphRecorder final : public Recorder {
 public:
  explicit CudaGraphRecorder(const torch::Device& device)
      : device_(device), side_(c10::cuda::getStreamFromPool(false, device.index())) {}

  bool supports(const torch::Tensor& x) const override {
    return x.is_cuda() && x.device() == device_;
  }

  void warm_up(const std::function<void()>& body) override {
    on_recording_stream([&] { body(); });
  }

  std::unique_ptr<Recording> record(const std::function<void()>& body, int pool) override {
    auto graph = std::make_unique<Graph>();
    // The default generator's offsets are read from the device at replay (graph-safe RNG).
    graph->register_generator_state(at::cuda::detail::getDefaultCUDAGenerator(device_.index()));
    const auto known = pools_.find(pool);
    const at::cuda::MempoolId_t id =
        known == pools_.end() ? at::cuda::MempoolId_t{0, 0} : known->second;
    on_recording_stream([&] {
      // Thread-local: other threads (the loader's, NCCL's, autograd's) keep their CUDA calls.
      graph->capture_begin(id, cudaStreamCaptureModeThreadLocal);
      try {
        body();
        graph->capture_end();
      } catch (...) {
        graph->abort();
        throw;
      }
    });
    if (known == pools_.end()) pools_.emplace(pool, graph->pool());
    return std::make_unique<GraphRecording>(std::move(graph));
  }

  void synchronize() override { c10::cuda::getCurrentCUDAStream(device_.index()).synchronize(); }

  int64_t pool_bytes() const override {
    if (pools_.empty()) return 0;
    int64_t bytes = 0;
    const auto snapshot = c10::cuda::CUDACachingAllocator::snapshot({0, 0}, false);
    for (const auto& segment : snapshot.segments) {
      for (const auto& [index, id] : pools_) {
        if (segment.device == device_.index() && segment.owner_private_pool_id == id) {
          bytes += static_cast<int64_t>(segment.total_size);
        }
      }
    }
    return bytes;
  }

 private:
  // Runs fn on the current stream, or, where that is the default stream (no capture there), on
  // the side stream, ordered after the current stream's work and before what it queues next.
  template <typename Fn>
  void on_recording_stream(Fn&& fn) {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_.index());
    if (current != c10::cuda::getDefaultCUDAStream(device_.index())) {
      fn();
      return;
    }
    at::cuda::CUDAEvent before;
    before.record(current);
    before.block(side_);
    {
      const c10::cuda::CUDAStreamGuard guard(side_);
      fn();
    }
    at::cuda::CUDAEvent after;
    after.record(side_);
    after.block(current);
  }

  torch::Device device_;
  c10::cuda::CUDAStream side_;
  std::map<int, at::cuda::MempoolId_t> pools_;
};

}  // namespace

struct TrainingStream::Impl {
  explicit Impl(const torch::Device& device)
      : guard(c10::cuda::getStreamFromPool(false, device.index())) {}
  c10::cuda::CUDAStreamGuard guard;
};

TrainingStream::TrainingStream(const torch::Device& device) {
  if (device.is_cuda()) impl_ = std::make_unique<Impl>(device);
}

TrainingStream::~TrainingStream() = default;

std::shared_ptr<Recorder> cuda_graph_recorder(const torch::Device& device) {
  if (!device.is_cuda()) {
    fail(ErrorKind::kInternal, "cuda_graph_recorder: {} is not a CUDA device", device.str());
  }
  return std::make_shared<CudaGraphRecorder>(device);
}

#else

struct TrainingStream::Impl {};

TrainingStream::TrainingStream(const torch::Device& device) {
  if (device.is_cuda()) {
    fail(ErrorKind::kNotImplemented,
         "this dstrain was built without CUDA: no CUDA stream; see docs/gpu.md");
  }
}

TrainingStream::~TrainingStream() = default;

std::shared_ptr<Recorder> cuda_graph_recorder(const torch::Device&) {
  fail(ErrorKind::kNotImplemented,
       "this dstrain was built without CUDA: CUDA graphs are not available; see docs/gpu.md");
}

#endif

}  // namespace dstrain::model
