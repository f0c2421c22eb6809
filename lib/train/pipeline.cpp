#include "train/pipeline.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <list>

#include "core/error.h"
#include "core/trace.h"
#include "model/rng_state.h"
#include "model/storage.h"

namespace dstrain::train {
namespace {

// Micro-batch and chunk of a rank's k-th forward (or backward) under interleaving: micro-batches
// P at a time through each chunk in turn (backward: the chunks in reverse).
PipelineAction interleaved_action(bool forward, int k, int stages, int chunks) {
  const int group = k % (stages * chunks);
  const int chunk = group / stages;
  PipelineAction a;
  a.forward = forward;
  a.micro_batch = (k / (stages * chunks)) * stages + k % stages;
  a.chunk = forward ? chunk : chunks - 1 - chunk;
  return a;
}

// How many forwards rank `stage` runs before its first backward: 1F1B's and interleaving's
// warm-up (after it, forward and backward alternate until the cool-down's backwards); GPipe's
// every forward.
int pipeline_warmup(PipelineSchedule schedule, int stages, int stage, int micro_batches,
                    int chunks) {
  const int total = micro_batches * chunks;
  switch (schedule) {
    case PipelineSchedule::kGpipe:
      return total;
    case PipelineSchedule::kOneForwardOneBackward:
      return std::min(total, stages - stage - 1);
    case PipelineSchedule::kInterleaved:
      return std::min(total, (stages - stage - 1) * 2 + (chunks - 1) * stages);
  }
  return total;
}

}  // namespace

const char* schedule_word(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGpipe:
      return "gpipe";
    case PipelineSchedule::kOneForwardOneBackward:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved_1f1b";
  }
  return "unknown";
}

std::vector<PipelineAction> pipeline_schedule(PipelineSchedule schedule, int stages, int stage,
                                              int micro_batches, int chunks,
                                              const std::string& key) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 1 || chunks < 1) {
    fail(ErrorKind::kInternal, "pipeline schedule: stage {} of {}, {} micro-batches, {} chunks",
         stage, stages, micro_batches, chunks);
  }
  if (schedule != PipelineSchedule::kInterleaved && chunks != 1) {
    fail(ErrorKind::kInternal, "pipeline schedule {}: {} chunks a rank; only interleaving has more",
         schedule_word(schedule), chunks);
  }
  std::vector<PipelineAction> out;
  if (schedule == PipelineSchedule::kGpipe) {
    for (int i = 0; i < micro_batches; ++i) out.push_back({true, i, 0});
    for (int i = 0; i < micro_batches; ++i) out.push_back({false, i, 0});
    return out;
  }
  if (schedule == PipelineSchedule::kInterleaved && micro_batches % stages != 0) {
    fail(ErrorKind::kConfig,
         "{} is {}: interleaved pipeline schedules need a multiple of the {} pipeline stages "
         "(Megatron-LM's rule)",
         key, micro_batches, stages);
  }
  const int total = micro_batches * chunks;
  const int warmup = pipeline_warmup(schedule, stages, stage, micro_batches, chunks);
  for (int k = 0; k < warmup; ++k) out.push_back(interleaved_action(true, k, stages, chunks));
  for (int k = 0; k + warmup < total; ++k) {
    out.push_back(interleaved_action(true, k + warmup, stages, chunks));
    out.push_back(interleaved_action(false, k, stages, chunks));
  }
  for (int k = total - warmup; k < total; ++k) {
    out.push_back(interleaved_action(false, k, stages, chunks));
  }
  return out;
}

double pipeline_bubble(int stages, int micro_batches, int chunks) {
  return static_cast<double>(stages - 1) / (chunks * micro_batches + stages - 1);
}

StageRanges balance_stages(const std::vector<double>& costs, int parts, const std::string& key) {
  const size_t n = costs.size();
  const auto k = static_cast<size_t>(std::max(parts, 1));
  if (n < k) {
    fail(ErrorKind::kConfig, "{}: {} pipeline stages for a model of {} blocks; expected at most {}",
         key, parts, n, n);
  }
  std::vector<double> prefix(n + 1, 0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // best[j][i]: the smallest largest-stage cost of blocks [0, i) in j stages; cut[j][i] where the
  // last of them starts.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(k + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<size_t>> cut(k + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (size_t j = 1; j <= k; ++j) {
    for (size_t i = j; i <= n - (k - j); ++i) {
      // The earliest start first: on a tie the last stage is the larger, the earlier smaller.
      for (size_t s = j - 1; s < i; ++s) {
        const double cost = std::max(best[j - 1][s], prefix[i] - prefix[s]);
        if (cost < best[j][i]) {
          best[j][i] = cost;
          cut[j][i] = s;
        }
      }
    }
  }
  StageRanges out(k);
  size_t end = n;
  for (size_t j = k; j >= 1; --j) {
    out[j - 1] = {cut[j][end], end};
    end = cut[j][end];
  }
  return out;
}

std::vector<double> block_costs(const model::DecoderModelImpl& model) {
  std::vector<double> out;
  for (const auto& block : model.blocks()) {
    double cost = block->block->multiply_adds_per_token();
    if (cost >= 0) {
      out.push_back(cost);
      continue;
    }
    cost = 0;
    if (block->role != model::BlockRole::kEmbedding) {
      for (const model::BlockParameter& p : block->parameters) {
        if (p.tensor.dim() == 2) cost += static_cast<double>(p.tensor.numel());
      }
      // The tied head reads the embedding's matrix, which is not its own parameter.
      if (block->role == model::BlockRole::kHead && cost == 0) {
        cost = static_cast<double>(model.head_weight().numel());
      }
    }
    out.push_back(cost);
  }
  return out;
}

PipelineStage::PipelineStage(model::DecoderModelImpl& model, comm::Communicator* group,
                             StageRanges stages, StageOptions options)
    : model_(model),
      group_(group),
      stages_(std::move(stages)),
      options_(options),
      engine_(options.engine),
      rank_(group ? group->rank() : 0),
      size_(group ? group->world_size() : 1) {
  const auto parts = static_cast<int>(stages_.size());
  if (parts < size_ || parts % size_ != 0) {
    fail(ErrorKind::kInternal, "pipeline: {} stages over {} ranks", parts, size_);
  }
  chunks_ = parts / size_;
  if (stages_.front().first != 0 || stages_.back().second != model_.blocks().size()) {
    fail(ErrorKind::kInternal, "pipeline: the stages do not cover the model's blocks");
  }
  const int last = rank_of(parts - 1);
  // The hidden states between stages come in the dtype this rank's blocks compute in: that of
  // their parameters as the engine holds them (a middle stage holds neither the embedding nor
  // the head, whose dtype is the model's as built).
  hidden_options_ = model_.head_weight().options();
  for (size_t i : blocks()) {
    for (const model::BlockParameter& p : model_.blocks()[i]->parameters) {
      if (model::storage_bytes(p.tensor) > 0) hidden_options_ = p.tensor.options();
    }
  }
  if (model_.config().tie_word_embeddings && size_ > 1) {
    // The other ranks pass kNoGroup: a group of theirs, dropped at once, could be closed while
    // its other member still connects (communicator.h).
    auto pair = group_->split(rank_ == 0 || rank_ == last ? 0 : comm::kNoGroup);
    if (rank_ == 0 || rank_ == last) tied_ = std::move(pair);
  }
}

int64_t tied_copy_bytes(const model::DecoderModelImpl& model, const StageRanges& stages, int ranks,
                        int rank, int element_bytes, bool head_trains) {
  if (!model.config().tie_word_embeddings || ranks <= 1) return 0;
  const std::vector<size_t> mine = rank_blocks(stages, ranks, rank);
  if (std::find(mine.begin(), mine.end(), model.blocks().size() - 1) == mine.end()) return 0;
  const int64_t elements = model.head_weight().numel();
  return elements * (element_bytes + (head_trains ? 4 : 0));
}

StageRanges split_stages(const std::vector<int64_t>& layers, const model::DecoderModelImpl& model,
                         const std::string& key) {
  const int64_t have = model.config().num_hidden_layers;
  int64_t sum = 0;
  for (int64_t n : layers) sum += n;
  if (sum != have || layers.empty()) {
    fail(ErrorKind::kConfig,
         "{}: the stages' layer counts add up to {}, but the model has {} layers", key, sum, have);
  }
  // Blocks: the embedding, the layers in order, the head.
  StageRanges out;
  size_t first = 0;
  for (size_t s = 0; s < layers.size(); ++s) {
    size_t end = first + static_cast<size_t>(layers[s]) + (s == 0 ? 1 : 0);
    if (s + 1 == layers.size()) end = model.blocks().size();
    out.emplace_back(first, end);
    first = end;
  }
  return out;
}

int in_flight_chunks(const std::vector<PipelineAction>& actions) {
  int now = 0, most = 0;
  for (const PipelineAction& a : actions) {
    now += a.forward ? 1 : -1;
    most = std::max(most, now);
  }
  return most;
}

std::vector<size_t> rank_blocks(const StageRanges& stages, int ranks, int rank) {
  std::vector<size_t> out;
  for (size_t s = static_cast<size_t>(rank); s < stages.size(); s += static_cast<size_t>(ranks)) {
    for (size_t i = stages[s].first; i < stages[s].second; ++i) out.push_back(i);
  }
  return out;
}

std::vector<size_t> PipelineStage::blocks() const {
  return rank_blocks(stages_, size_, rank_);
}

// The hidden states between stages: [B, T, C] in this rank's dtype (T this rank's tokens under
// sequence parallelism), or its token rows [n, C] under tensor parallelism's sequence parallelism.
std::vector<int64_t> PipelineStage::hidden_shape(const MicroBatch& mb) const {
  const int64_t B = mb.input_ids.size(0), T = mb.input_ids.size(1);
  const int64_t C = model_.config().hidden_size;
  const model::TensorParallel* tp = model_.tensor_parallel();
  if (tp != nullptr && tp->sequence_parallel()) return {B * T / tp->size(), C};
  return {B, T, C};
}

model::TensorParallel* PipelineStage::split_over(int64_t numel) const {
  model::TensorParallel* tp = model_.tensor_parallel();
  if (tp == nullptr || tp->size() == 1 || tp->sequence_parallel()) return nullptr;
  return numel % tp->size() == 0 ? tp : nullptr;
}

torch::Tensor PipelineStage::sent_part(const torch::Tensor& whole) const {
  const torch::Tensor sent = whole.detach().contiguous();
  model::TensorParallel* tp = split_over(sent.numel());
  if (tp == nullptr) return sent;
  const int64_t n = sent.numel() / tp->size();
  return sent.view({-1}).narrow(0, tp->rank() * n, n);
}

torch::Tensor PipelineStage::receive_buffer(const std::vector<int64_t>& shape) const {
  const int64_t numel = c10::multiply_integers(shape);
  model::TensorParallel* tp = split_over(numel);
  return torch::empty(tp == nullptr ? shape : std::vector<int64_t>{numel / tp->size()},
                      hidden_options_);
}

torch::Tensor PipelineStage::received_whole(const torch::Tensor& received,
                                            const std::vector<int64_t>& shape) const {
  model::TensorParallel* tp = split_over(c10::multiply_integers(shape));
  if (tp == nullptr) return received;
  torch::NoGradGuard no_grad;
  return tp->gather_rows(received).view(shape);
}

model::LossSum PipelineStage::begin(int micro_batches) {
  in_flight_.clear();
  in_flight_.resize(static_cast<size_t>(chunks_));
  for (auto& chunk : in_flight_) chunk.resize(static_cast<size_t>(micro_batches));
  const torch::TensorOptions f32 = model_.head_weight().options().dtype(torch::kFloat);
  step_loss_ = torch::zeros({}, f32.dtype(torch::kDouble));
  return {torch::zeros({}, f32), torch::zeros({}, f32.dtype(torch::kLong))};
}

void PipelineStage::transfer(std::vector<comm::PeerTransfer> incoming) {
  std::vector<comm::PeerTransfer> batch = std::move(outgoing_);
  outgoing_.clear();
  for (comm::PeerTransfer& t : incoming) batch.push_back(std::move(t));
  if (!batch.empty()) group_->exchange(std::move(batch))->wait();
}

void PipelineStage::run_overlapped(const std::vector<PipelineAction>& actions,
                                   const std::vector<MicroBatch>& micro_batches,
                                   const std::function<void(const PipelineAction&)>& compute) {
  // Each action's sends go in one batch with the receive of the next action of the same direction
  // (forward: the next forward's input; backward: the next backward's gradient), and with the
  // first backward's receive after the forward before it; a batch is waited on only before the
  // action whose receive it carries, so its transfers overlap the actions in between
  // (Megatron-LM's overlapped interleaved schedule). Every batch is waited on by the step's end.
  const size_t n = actions.size();
  std::vector<std::shared_ptr<comm::Work>> carries(n);  // the batch with action k's receive
  std::list<std::shared_ptr<comm::Work>> outstanding;
  const auto post = [&](std::vector<comm::PeerTransfer> batch, const std::vector<size_t>& for_) {
    if (batch.empty()) return;
    std::shared_ptr<comm::Work> work = group_->exchange(std::move(batch));
    for (size_t k : for_) carries[k] = work;
    outstanding.push_back(std::move(work));
  };
  // Appends action k's receive, if it has one, and notes which action the batch serves.
  const auto add_receive = [&](size_t k, std::vector<comm::PeerTransfer>& batch,
                               std::vector<size_t>& for_) {
    const size_t before = batch.size();
    receive(actions[k], micro_batches.at(static_cast<size_t>(actions[k].micro_batch)), batch);
    if (batch.size() > before) for_.push_back(k);
  };
  const auto next_like = [&](size_t k) {
    for (size_t j = k + 1; j < n; ++j) {
      if (actions[j].forward == actions[k].forward) return j;
    }
    return n;
  };
  {
    std::vector<comm::PeerTransfer> batch;
    std::vector<size_t> for_;
    add_receive(0, batch, for_);
    post(std::move(batch), for_);
  }
  bool backward_seen = false;
  for (size_t k = 0; k < n; ++k) {
    if (carries[k]) {
      carries[k]->wait();
      outstanding.remove(carries[k]);
      carries[k].reset();
    }
    compute(actions[k]);
    std::vector<comm::PeerTransfer> batch = std::move(outgoing_);
    outgoing_.clear();
    std::vector<size_t> for_;
    if (const size_t j = next_like(k); j < n) add_receive(j, batch, for_);
    if (actions[k].forward && !backward_seen && k + 1 < n && !actions[k + 1].forward) {
      add_receive(k + 1, batch, for_);
    }
    backward_seen = backward_seen || !actions[k].forward;
    post(std::move(batch), for_);
  }
  for (const auto& work : outstanding) work->wait();
}

void PipelineStage::finish() {
  transfer({});
  in_flight_.clear();
}

torch::Tensor PipelineStage::router_buffer(int64_t numel) const {
  return torch::empty({numel}, hidden_options_.dtype(torch::kFloat));
}

model::LossSum PipelineStage::run(const std::vector<MicroBatch>& micro_batches,
                                  const MicroStepLoss& loss, const std::string& micro_batch_key,
                                  StepPart part) {
  const int m = static_cast<int>(micro_batches.size());
  model::LossSum total = begin(m);
  carry_router_ = stages_.size() > 1 && model_.config().moe.router_losses();
  const int micro_steps = m * chunks_;
  // The first stage's extra micro-step adds the head's gradient of a tied matrix.
  const bool tied_step = engine_tied() && rank_ == 0 && model_.head_weight().requires_grad();
  int engine_steps = micro_steps + (tied_step ? 1 : 0);
  if (part.of > 0) {
    if (stages_.size() > 1 || part.first < 0 || part.first + m > part.of) {
      fail(ErrorKind::kInternal, "pipeline: micro-steps [{}, {}) of {} on a pipeline of {} stages",
           part.first, part.first + m, part.of, stages_.size());
    }
    engine_steps = part.of;
  }
  const std::vector<PipelineAction> actions =
      pipeline_schedule(options_.schedule, size_, rank_, m, chunks_, micro_batch_key);
  int backwards = part.first;
  const auto compute = [&](const PipelineAction& a) {
    if (a.forward) {
      forward(a, micro_batches.at(static_cast<size_t>(a.micro_batch)), &loss, total);
    } else {
      backward(a, {backwards++, engine_steps});
    }
  };
  if (options_.schedule == PipelineSchedule::kInterleaved) {
    run_overlapped(actions, micro_batches, compute);
  } else {
    // One action at a time (Megatron-LM's 1F1B): before each, the previous one's sends and its
    // own receive in one batch. 1F1B leaves nothing to overlap them with: a backward needs the
    // gradient its neighbour is computing.
    for (const PipelineAction& a : actions) {
      std::vector<comm::PeerTransfer> incoming;
      receive(a, micro_batches.at(static_cast<size_t>(a.micro_batch)), incoming);
      transfer(std::move(incoming));
      compute(a);
    }
  }
  finish();  // the last unit's sends
  // The engine divided each micro-step's loss by their count.
  if (engine_ != nullptr) step_loss_ /= static_cast<double>(part.of > 0 ? part.of : micro_steps);
  if (engine_tied()) exchange_tied_grad(engine_steps);
  if (tied_ != nullptr && engine_ == nullptr) {
    torch::Tensor grad = model_.head_weight().grad();
    if (!grad.defined()) grad = torch::zeros_like(model_.head_weight());
    tied_->all_reduce(grad, comm::ReduceOp::kSum)->wait();
    model_.head_weight().mutable_grad() = grad;
  }
  return total;
}

model::LossSum PipelineStage::evaluate(const std::vector<MicroBatch>& micro_batches) {
  torch::NoGradGuard no_grad;
  const int m = static_cast<int>(micro_batches.size());
  model::LossSum total = begin(m);
  carry_router_ = false;
  // Each micro-batch through every chunk before the next (a chunk-major order would leave the last
  // rank's sends to the first rank's next chunk unreceived while the first waits on its own).
  for (int i = 0; i < m; ++i) {
    for (int c = 0; c < chunks_; ++c) {
      const PipelineAction a{true, i, c};
      std::vector<comm::PeerTransfer> incoming;
      receive(a, micro_batches[static_cast<size_t>(i)], incoming);
      transfer(std::move(incoming));
      forward(a, micro_batches[static_cast<size_t>(i)], nullptr, total);
      in_flight_[static_cast<size_t>(c)][static_cast<size_t>(i)] = InFlight{};
    }
  }
  finish();
  return total;
}

void PipelineStage::sync_tied() {
  if (!engine_tied()) return;
  torch::NoGradGuard no_grad;
  const torch::Tensor& w = model_.head_weight();
  if (rank_ == 0) {
    tied_->send(w.detach().contiguous(), 1)->wait();
    return;
  }
  if (model::storage_bytes(w) == 0) {
    // Outside the head's engine: this rank's copy, in the dtype its engine computes in.
    w.set_data(torch::empty(w.sizes(), hidden_options_));
  }
  torch::Tensor into = w.detach();
  tied_->recv(into, 0)->wait();
}

void PipelineStage::exchange_tied_grad(int micro_steps) {
  const torch::Tensor& w = model_.head_weight();
  if (!w.requires_grad()) return;  // frozen (LoRA): nothing to add
  if (rank_ != 0) {
    torch::Tensor grad = tied_grad_.defined()
                             ? tied_grad_
                             : torch::zeros(w.sizes(), w.options().dtype(torch::kFloat));
    tied_->send(grad, 0)->wait();
    tied_grad_ = torch::Tensor();
    return;
  }
  torch::Tensor grad = torch::empty(w.sizes(), w.options().dtype(torch::kFloat));
  tied_->recv(grad, 1)->wait();
  // Through a view, so that autograd reaches the matrix's accumulator and the engine's hooks.
  engine_->backward_from(w.view_as(w), grad.to(w.scalar_type()), {micro_steps - 1, micro_steps});
}

void PipelineStage::receive(const PipelineAction& a, const MicroBatch& mb,
                            std::vector<comm::PeerTransfer>& incoming) {
  const int s = virtual_stage(a.chunk);
  const int last = static_cast<int>(stages_.size()) - 1;
  InFlight& f = in_flight_[static_cast<size_t>(a.chunk)][static_cast<size_t>(a.micro_batch)];
  f.shape = hidden_shape(mb);
  const int64_t E = model_.config().moe.experts;
  if (a.forward && s > 0) {
    f.input = receive_buffer(f.shape);
    incoming.push_back({comm::CollectiveKind::kRecv, f.input, rank_of(s - 1)});
    if (carry_router_) {
      f.router_in = router_buffer(2 * E + 2);
      incoming.push_back({comm::CollectiveKind::kRecv, f.router_in, rank_of(s - 1)});
    }
  } else if (!a.forward && s < last) {
    // The shape of the output (which an overlapped schedule may not have computed yet).
    f.output_grad = receive_buffer(f.shape);
    incoming.push_back({comm::CollectiveKind::kRecv, f.output_grad, rank_of(s + 1)});
    if (carry_router_) {
      f.router_grad_in = router_buffer(E + 1);
      incoming.push_back({comm::CollectiveKind::kRecv, f.router_grad_in, rank_of(s + 1)});
    }
  }
}

void PipelineStage::forward(const PipelineAction& a, const MicroBatch& mb,
                            const MicroStepLoss* loss, model::LossSum& total) {
  const int s = virtual_stage(a.chunk);
  const bool last = s == static_cast<int>(stages_.size()) - 1;
  const auto& [first_block, end_block] = stages_.at(static_cast<size_t>(s));
  InFlight& f = in_flight_[static_cast<size_t>(a.chunk)][static_cast<size_t>(a.micro_batch)];
  torch::Tensor x = mb.input_ids;
  if (s > 0) {
    f.input = received_whole(f.input, f.shape).requires_grad_(true);
    x = f.input;
  }
  trace::Span span("forward", "forward", {"micro_batch", a.micro_batch}, {"chunk", a.chunk});
  const int64_t B = mb.input_ids.size(0), T = mb.input_ids.size(1);
  if (mb.positions.documents) {
    mb.positions.documents->check(
        B, mb.positions.length > 0 ? mb.positions.length : mb.positions.first + T);
  }
  // The head takes the labels and returns its fused loss sum; unfused, it returns logits.
  const bool fused = last && options_.fused_loss;
  model::BlockContext ctx = model_.context(T, mb.positions, fused ? mb.labels : torch::Tensor());
  // The model's RoPE tables take the embedding's dtype, which a stage without the embedding
  // holds only as built: this rank's.
  ctx.cos = ctx.cos.to(hidden_options_.dtype());
  ctx.sin = ctx.sin.to(hidden_options_.dtype());
  ctx.real_tokens = mb.real_tokens;
  if (carry_router_) {
    if (s > 0) ctx.router->set_incoming(f.router_in);
    f.router = ctx.router;
  }
  for (size_t i = first_block; i < end_block; ++i) {
    if (mb.draws) model::seed_rng(model::draw_key({*mb.draws, i}), {x});
    x = model_.run_block(i, x, ctx);
  }
  if (ctx.router && ctx.training) {
    if (const torch::Tensor load = ctx.router->load(); load.defined()) {
      expert_load_ = expert_load_.defined() ? expert_load_ + load : load;
    }
  }
  if (!last) {
    outgoing_.push_back({comm::CollectiveKind::kSend, sent_part(x), rank_of(s + 1)});
    if (carry_router_) {
      torch::Tensor pooled = ctx.router->outgoing();  // none yet: zeros
      if (!pooled.defined()) pooled = router_buffer(2 * model_.config().moe.experts + 2).zero_();
      outgoing_.push_back({comm::CollectiveKind::kSend, pooled, rank_of(s + 1)});
    }
    // Its backward reads only its autograd edge (zero::run_backward): the data goes once sent.
    if (!x.is_view()) x.set_data(torch::empty({0}, x.options()));
    f.output = x;
    if (options_.peaks) span.set_arg(peak_arg(*options_.peaks, StepPhase::kForward));
    return;
  }
  model::LossSum head{x, mb.labels.ne(model::kIgnoreIndex).sum()};
  if (!fused) {
    // Tensor parallelism's sequence parallelism: the logits of every token row, [B·T, V].
    if (x.dim() == 2) x = x.view({B, T, x.size(-1)});
    head = model::causal_lm_loss_sum(x, mb.labels);
  }
  if (ctx.router) head.router = ctx.router->totals(head.sum);
  {
    torch::NoGradGuard no_grad;
    total.sum += head.sum.detach();
    total.count += head.count;
  }
  if (loss != nullptr) {
    f.output = (*loss)(head);
    step_loss_ += f.output.detach().to(torch::kDouble);
  }
  if (options_.peaks) span.set_arg(peak_arg(*options_.peaks, StepPhase::kForward));
}

void PipelineStage::backward(const PipelineAction& a, zero::MicroStep micro) {
  const int s = virtual_stage(a.chunk);
  const int last = static_cast<int>(stages_.size()) - 1;
  InFlight& f = in_flight_[static_cast<size_t>(a.chunk)][static_cast<size_t>(a.micro_batch)];
  trace::Span span("backward", "backward", {"micro_batch", a.micro_batch}, {"chunk", a.chunk});
  if (s == last) {
    if (engine_ != nullptr) {
      engine_->backward(f.output, micro);
    } else {
      f.output.backward();
    }
    const torch::Tensor& w = model_.head_weight();
    if (engine_tied() && w.grad().defined()) {
      // Summed in float32 over the step's micro-batches (in place: one float32 matrix held),
      // then sent to the first stage.
      if (tied_grad_.defined()) {
        tied_grad_.add_(w.grad());
      } else {
        tied_grad_ = w.grad().to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
      }
      w.mutable_grad() = torch::Tensor();
    }
  } else {
    // The router sums' gradient the last stage computed, for this stage's layers (moe.h).
    if (carry_router_) f.router->set_sums_grad(f.router_grad_in);
    // (A first stage with nothing to train, a frozen embedding under LoRA, has no graph.)
    const torch::Tensor grad = received_whole(f.output_grad, f.shape);
    if (engine_ != nullptr) {
      engine_->backward_from(f.output, grad, micro);
    } else {
      zero::run_backward(f.output, grad);
    }
  }
  if (s > 0) {
    outgoing_.push_back({comm::CollectiveKind::kSend, sent_part(f.input.grad()), rank_of(s - 1)});
    if (carry_router_) {
      torch::Tensor grad = f.router->sums_grad();  // none (no sums reached the loss): zeros
      if (!grad.defined()) grad = router_buffer(model_.config().moe.experts + 1).zero_();
      outgoing_.push_back(
          {comm::CollectiveKind::kSend, grad.to(torch::kFloat).contiguous(), rank_of(s - 1)});
    }
  }
  f = InFlight{};
  if (options_.peaks) span.set_arg(peak_arg(*options_.peaks, StepPhase::kBackward));
}

}  // namespace dstrain::train
