#pragma once
// Pipeline parallelism: the model's block list (model/blocks.h) cut into contiguous stages, one
// per rank of a pipeline group (or, interleaved, `chunks` virtual stages per rank), and a step's
// micro-batches run through them by a schedule, the activations and their gradients sent between
// neighbouring stages point to point (comm::Communicator::exchange). A run without pipeline
// parallelism is a pipeline of one stage: every step and evaluation of the trainer runs here.
//
// Virtual stages. With P ranks and v chunks a rank there are P·v virtual stages in block order;
// virtual stage s lives on rank s mod P as its chunk s / P (Megatron-LM's interleaving: rank p
// holds stages p, p + P, p + 2P, ...). v = 1 is the plain pipeline.
//
// Schedules (pipeline_schedule), for m micro-batches, each rank's list of actions in order:
//   GPipe             every forward, then every backward (the last micro-batch first).
//   1F1B              P − p − 1 forwards to fill the pipeline, then one forward and one backward
//                     in turn, then the remaining backwards (PipeDream-flush, Megatron-LM's
//                     default): at most P − p micro-batches' activations held at once.
//   interleaved 1F1B  the same over the rank's v chunks, micro-batches taken P at a time through
//                     each chunk (Megatron-LM's order; m a multiple of P): the bubble shrinks by v.
// With equal forward and backward times t per stage and micro-batch, a step takes 2t·(m + P − 1)
// under GPipe and 1F1B, the idle share of it (P − 1)/(m + P − 1), and 2t·(m + (P − 1)/v) per
// chunk under interleaving: (P − 1)/(v·m + P − 1) idle (pipeline_bubble).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "comm/communicator.h"
#include "model/model.h"
#include "train/phase_peaks.h"
#include "zero/engine.h"

namespace dstrain::train {

enum class PipelineSchedule { kGpipe, kOneForwardOneBackward, kInterleaved };

// "gpipe", "1f1b", "interleaved_1f1b".
const char* schedule_word(PipelineSchedule schedule);

struct PipelineAction {
  bool forward = true;  // else backward
  int micro_batch = 0;
  int chunk = 0;  // the rank's virtual stage: 0 .. chunks − 1
  bool operator==(const PipelineAction& o) const {
    return forward == o.forward && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

// Rank `stage`'s actions for one step. Error(kConfig) naming `key` (the micro-batch setting) when
// interleaving with micro_batches not a multiple of stages; Error(kInternal) for counts < 1 or a
// chunk count other than 1 without interleaving.
std::vector<PipelineAction> pipeline_schedule(PipelineSchedule schedule, int stages, int stage,
                                              int micro_batches, int chunks,
                                              const std::string& key);

// The most micro-batch chunks whose forward has run and whose backward has not, at any point of
// `actions` (a rank's schedule): what its stages hold at their fullest. 1F1B: min(m, P − p); GPipe:
// m; interleaved: min(m·v, 2(P − p − 1) + (v − 1)·P + 1), each chunk 1/v of the rank's blocks.
int in_flight_chunks(const std::vector<PipelineAction>& actions);

// The idle share of a step with equal forward and backward times (header): (P − 1)/(v·m + P − 1).
double pipeline_bubble(int stages, int micro_batches, int chunks);

// Blocks [first, last) of each virtual stage, in block order.
using StageRanges = std::vector<std::pair<size_t, size_t>>;

// `costs[i]` is block i's; contiguous ranges of at least one block each for `parts` stages that
// minimise the largest stage's cost (ties: the earlier stages smaller). Error(kConfig) naming
// `key` when there are fewer blocks than parts.
StageRanges balance_stages(const std::vector<double>& costs, int parts, const std::string& key);

// The estimated cost of each block of `model`: its matrices' multiply-adds per token (a layer's
// projections, the head's vocabulary projection: the parameters they read), the embedding's lookup
// none; attention's score products are left out (they grow with the sequence, alike in every
// layer, so they move no boundary between layers).
std::vector<double> block_costs(const model::DecoderModelImpl& model);

// The stages of parallel.pipeline_split: `layers[s]` decoder layers in stage s, in order, the
// embedding on the first and the head on the last. Error(kConfig) naming `key` unless they add up
// to the model's layers.
StageRanges split_stages(const std::vector<int64_t>& layers, const model::DecoderModelImpl& model,
                         const std::string& key);

// The blocks rank `rank` of `ranks` runs (its virtual stages rank, rank + ranks, ...), in block
// order.
std::vector<size_t> rank_blocks(const StageRanges& stages, int ranks, int rank);

// Bytes pipeline rank `rank` of `ranks` holds for a tied embedding besides its engine's
// (PipelineStage below): on the head's rank the matrix's copy in the compute dtype (`element_bytes`
// an element), and when the head trains the float32 sum of its gradient over the step's
// micro-batches (a backward's gradient of it is the head's, counted with its activations); 0
// elsewhere, for an untied model and for a pipeline of one stage.
int64_t tied_copy_bytes(const model::DecoderModelImpl& model, const StageRanges& stages, int ranks,
                        int rank, int element_bytes, bool head_trains);

// One rank's stages of a model and the schedule's run of a step over them. The model is whole on
// every rank (it runs only its blocks; their parameters are the only ones it trains); `group` is
// the pipeline's ranks, rank p holding virtual stages p, p + P, ... Construction is collective over
// `group` (with tied embeddings it splits off the first and last stages' ranks).
//
// Tied embeddings with an engine: the first stage's engine holds the embedding matrix; the rank
// holding the head keeps a plain copy of it outside its engine, whose gradient (summed over the
// step's micro-batches, in float32) it sends to the first stage at the end of its backwards; the
// first stage adds it to the matrix's in one more micro-step of its engine (so the norm and the
// update see the sum once), and sync_tied() sends the updated matrix back.
// What a stage does besides its blocks' forwards and backwards.
struct StageOptions {
  PipelineSchedule schedule = PipelineSchedule::kOneForwardOneBackward;
  // Over this rank's blocks' parameters (zero/engine.h), or null: autograd alone.
  zero::Engine* engine = nullptr;
  // The head's loss fused with its projection (model.fused_loss); else logits, then the loss.
  bool fused_loss = true;
  // Each forward's and backward's allocator peak on its trace span (phase_peaks.h); null: none.
  PhasePeaks* peaks = nullptr;
};

// On a pipeline of one stage (no transfers, one chunk) a step may be run in several calls of
// PipelineStage::run: its micro-batches are then the engine's micro-steps [first, first + m) of
// `of` (so that something may happen between them: the trial step of micro-batch auto votes after
// the first). `of` 0: the micro-batches are the whole step. Error(kInternal) for a part of a
// pipeline's step.
struct StepPart {
  int first = 0;
  int of = 0;
};

class PipelineStage {
 public:
  // `group`: the pipeline's ranks, or null for a pipeline of one stage (no transfers). With
  // options.engine each backward is one of its micro-steps — chunks × micro-batches a step, in the
  // schedule's order, and on the first stage one more with tied embeddings — the last stage's
  // through backward(), the others' through backward_from(); the caller then calls
  // engine->step() and sync_tied(). Without, autograd alone: the gradients accumulate in the
  // parameters.
  PipelineStage(model::DecoderModelImpl& model, comm::Communicator* group, StageRanges stages,
                StageOptions options);

  // One micro-batch: token ids and aligned labels [B, T] (with sequence parallelism this rank's
  // tokens of them, at `positions`); every stage is given them (the first stage reads the ids, the
  // last the labels; the others only their shape). `positions` also holds packed documents'
  // bounds per row (model.h).
  // `draws`: the key of its random draws (LoRA dropout), the same on every rank that computes a
  // part of it; each block's draws then start from the generators seeded with the key and the
  // block's index (model::seed_rng), so a block draws what it draws on one rank whichever stage
  // runs it, in whichever order the schedule runs the micro-batches. Unset: nothing reseeded.
  struct MicroBatch {
    torch::Tensor input_ids;
    torch::Tensor labels;
    model::Positions positions;
    std::optional<uint64_t> draws{};
    // [B, T] bool (this rank's tokens): those that are not padding, which a MoE model's router
    // losses count; undefined: every token.
    torch::Tensor real_tokens{};
  };
  // The loss a micro-batch's backward starts from, given the head's loss sum and counted tokens
  // over that micro-batch (for the step's token mean: the sum × micro-steps / the step's counted
  // tokens); an engine's backward() then divides it by the step's micro-steps.
  using MicroStepLoss = std::function<torch::Tensor(const model::LossSum&)>;

  // Runs the step's forwards and backwards, each micro-batch's backward from `loss`. The
  // parameters of this rank's blocks accumulate their gradients (without an engine; tied
  // embeddings, read by the first stage and the head's, then get the sum of both ranks' gradients
  // on both). Returns the sum of the micro-batches' losses and counted tokens on the rank holding
  // the last stage, zeros elsewhere.
  // `part`: the micro-batches as part of a step (StepPart); default the whole step.
  model::LossSum run(const std::vector<MicroBatch>& micro_batches, const MicroStepLoss& loss,
                     const std::string& micro_batch_key, StepPart part = {});
  // The last run()'s micro-step losses summed in float64 and divided by the engine's micro-steps
  // (the step's loss) on the rank holding the last stage, zero elsewhere.
  const torch::Tensor& step_loss() const { return step_loss_; }
  // Tied embeddings over more than one rank with an engine: the first stage's matrix to the head's
  // rank (after each engine step, and once the engine holds its first values or a restored
  // checkpoint's). Collective over the two; nothing elsewhere.
  void sync_tied();

  // Forward only, without gradients (evaluation): the micro-batches in order through every stage.
  // Returns their losses and counted tokens on the rank holding the last stage, zeros elsewhere.
  model::LossSum evaluate(const std::vector<MicroBatch>& micro_batches);

  // A MoE model in training: each MoE layer's (token, expert) choices per expert, summed over the
  // forwards of run() since the last call, [MoE layers, E] float32 (zeros for other ranks'
  // layers); undefined for a dense model or when there were none.
  torch::Tensor take_expert_load() { return std::exchange(expert_load_, torch::Tensor()); }

  // The blocks this rank runs, in block order.
  std::vector<size_t> blocks() const;
  int chunks() const { return chunks_; }

 private:
  struct InFlight {
    std::vector<int64_t> shape;  // of the hidden states between stages (hidden_shape)
    torch::Tensor input;         // what the chunk received (requires grad), undefined on the first
    // What it sent, its data freed once sent (backward reads its autograd edge alone), or the
    // scaled loss on the last stage.
    torch::Tensor output;
    torch::Tensor output_grad;  // the gradient of `output` from the next stage
    // A MoE model's router losses over several stages (carry_router_): the router statistics of
    // the stages before, pooled (model::RouterRecord::pack), received with the input; the gradient
    // of their sums received with `output_grad`; and the forward's record, which the backward
    // hands that gradient.
    torch::Tensor router_in;
    torch::Tensor router_grad_in;
    c10::intrusive_ptr<model::RouterRecord> router;
  };
  // A step's or an evaluation's start (its micro-batches' slots, the zero totals) and end (the
  // last action's sends done).
  model::LossSum begin(int micro_batches);
  void finish();
  // Between two actions (1F1B, GPipe, an evaluation): the previous one's sends and the next
  // one's `incoming` receives as one batch, waited on (Megatron-LM's batched send-and-receive). On
  // NCCL a rank's transfers run in order on one stream and a send waits for its receive: sending
  // the output on and then receiving a gradient as two transfers would wait on a neighbour doing
  // the same the other way.
  void transfer(std::vector<comm::PeerTransfer> incoming);
  // The interleaved schedule's actions with their transfers overlapped (see the .cpp); `compute`
  // runs one action.
  void run_overlapped(const std::vector<PipelineAction>& actions,
                      const std::vector<MicroBatch>& micro_batches,
                      const std::function<void(const PipelineAction&)>& compute);
  // The receive action `a` needs (its input, or its output's gradient), if any, into its slot.
  void receive(const PipelineAction& a, const MicroBatch& mb,
               std::vector<comm::PeerTransfer>& incoming);
  // `loss`: null in an evaluation (no backward follows).
  void forward(const PipelineAction& a, const MicroBatch& mb, const MicroStepLoss* loss,
               model::LossSum& total);
  void backward(const PipelineAction& a, zero::MicroStep micro);
  int virtual_stage(int chunk) const { return chunk * size_ + rank_; }
  int rank_of(int virtual_stage) const { return virtual_stage % size_; }
  std::vector<int64_t> hidden_shape(const MicroBatch& mb) const;
  // Without tensor parallelism's sequence parallelism the hidden states (and their gradients) are
  // whole on every rank of a tensor-parallel group: each rank sends its 1/T of them and the
  // receiving group all-gathers them (Megatron-LM's scatter-gather of pipeline transfers), so the
  // group moves them once, not T times. split_over(): that group for states of `numel` elements
  // (null: whole transfers); sent_part(): what this rank sends of `whole`; receive_buffer(): what
  // it receives of states of `shape`; received_whole(): the states, gathered when split.
  model::TensorParallel* split_over(int64_t numel) const;
  torch::Tensor sent_part(const torch::Tensor& whole) const;
  torch::Tensor receive_buffer(const std::vector<int64_t>& shape) const;
  torch::Tensor received_whole(const torch::Tensor& received,
                               const std::vector<int64_t>& shape) const;
  // Tied embeddings with an engine, at the end of a step's backwards: the head's rank sends its
  // summed gradient of the matrix, the first stage adds it in its extra micro-step.
  void exchange_tied_grad(int micro_steps);
  bool engine_tied() const { return tied_ != nullptr && engine_ != nullptr; }

  model::DecoderModelImpl& model_;
  comm::Communicator* group_;  // null: one stage
  StageRanges stages_;         // every virtual stage's blocks
  StageOptions options_;
  zero::Engine* engine_;
  int rank_, size_, chunks_;
  torch::TensorOptions hidden_options_;           // the dtype and device of this rank's parameters
  std::vector<std::vector<InFlight>> in_flight_;  // by chunk, then micro-batch
  // What the last action sends on (its output to the next stage, or its input's gradient to the
  // one before), batched with the next action's receive.
  std::vector<comm::PeerTransfer> outgoing_;
  // With tied embeddings over more than one rank: the first stage's rank and the head's (null
  // on the others).
  std::unique_ptr<comm::Communicator> tied_;
  torch::Tensor tied_grad_;  // engine_tied() on the head's rank: this step's, float32
  torch::Tensor step_loss_;
  torch::Tensor expert_load_;  // take_expert_load()
  // In training, a MoE model's router losses pool every stage's layers (moe.h: the losses are
  // not linear in the statistics): each stage sends its statistics pooled with those it received
  // on with its output, and the last stage's gradient of the pooled sums goes back with the
  // gradients (the same for every layer). Off in evaluation (the evaluation loss is the LM loss).
  bool carry_router_ = false;
  torch::Tensor router_buffer(int64_t numel) const;
};

}  // namespace dstrain::train
