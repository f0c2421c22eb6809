#pragma once
// CUDA graphs per decoder layer: each layer's forward and backward recorded once per input shape
// and replayed, so that a micro-step launches a few graphs instead of thousands of kernels. At
// micro-batch 1 a layer's kernels are small and the host, not the GPU, sets the pace: replaying a
// recording costs one launch where the layer costs a hundred.
//
// Why per layer and not the whole micro-step: everything between the layers stays as it is — the
// ZeRO engine's gathers, releases, gradient hooks, bucket reductions and updates during backward,
// the embedding, the head's fused loss — so every stage, accumulation and LoRA keep their own code
// paths. A layer is a pure function of its input, its parameters and the RNG: what a graph can
// replay.
//
// How (the same scheme as PyTorch's make_graphed_callables, applied lazily): the first time a
// layer runs with a new input shape in training mode it is run once to warm up (cuBLAS and
// autograd initialise outside the recording), then its forward is recorded with a static input
// buffer, and, with grad enabled, its backward (autograd's gradient of the recorded output with
// respect to the input and every parameter the forward reached, found in the recorded graph) with
// a static output-gradient buffer. A call then copies its input into the static buffer and replays
// the forward; the layer's backward node copies the incoming gradient and replays the backward,
// and hands the parameter gradients to autograd, which accumulates them into .grad and fires the
// engine's post-accumulate hooks as without graphs. The parameters are read where they are at
// recording time: their memory must stay where it is (stages 0-2: the engine's flat buffers;
// stage 3: zero::EngineOptions::keep_gathered_memory).
//
// Randomness (LoRA dropout): a replay draws from the device generator at its current offset, as
// the eager kernels would, so replayed steps draw the same masks as eager ones; warm-up and
// recording leave the generators as they found them.
//
// Memory: the recordings of one input shape share one pool. Without activation checkpointing a
// forward's saved activations stay in that pool between replays (they are needed from the forward
// to the backward anyway, and the recording must find them at the same addresses). With it, the
// forward recorded under grad is the recompute, replayed right before its backward, so the pair's
// activations are freed after the backward's recording and the pool holds one layer's at a time.
//
// Where a recording fails (an operation that synchronises with the host, an unsupported kernel),
// the failure is undone, one warning names the layer and the cause, and from then on every layer
// not yet recorded runs eagerly. Eval (eval mode) and grad-free calls outside training run
// eagerly; so do input shapes beyond LayerGraphOptions::max_shapes.
//
// What is checked, so that a replay that would compute something else runs eagerly instead:
// - First use: each recording is compared with the eager run it replaces before it is used. The
//   warm-up is that eager run (its output, and with a backward the gradients of the input and of
//   every parameter for a seeded output gradient); a second eager run measures how much the eager
//   kernels themselves vary from run to run; then the recordings are replayed once on the same
//   input, RNG state and output gradient. Every output and gradient must satisfy
//     max |replay - eager|  <=  2 · max |eager - eager again|  +  4 · eps(dtype) · max |eager|
//   (eps as in kernel_check.h): bit for bit up to a few units in the last place where the kernels
//   are deterministic, and within their own spread where they are not (atomics in attention's
//   backward). A recording that fails the check is dropped and the layer runs eagerly.
// - Every replay: the parameters the layer reads (its own, the adapters it reached) must be where
//   they were recorded; one that moved (a re-flattening, a checkpoint load that replaced a tensor)
//   makes the layer run eagerly.
// - One forward per backward: without checkpointing a recorded forward's saved activations live in
//   the pool until its backward; a second forward of the same layer and shape before that backward
//   would overwrite them, so it runs eagerly and the layer stays eager.
// - Whether they pay (LayerGraphOptions::min_speedup; training.cuda_graphs: auto): the check also
//   times the second eager run and one more replay of the same work, each between two
//   synchronisations with the device; where the replays took more than 1/min_speedup of the eager
//   time, summed over the layers recorded by the first take_fallbacks(), every layer falls back.
// Each of these is a fallback (take_fallbacks()) that is eager on this rank at once; the trainer
// agrees them over the ranks (train/graphs_choice.h) so that every rank runs the layer the same
// way from the next step on (run_eagerly()). The step in which a fallback happens is computed as
// eagerly as it would be without graphs on the rank that found it.

// Install in WrapperSlot::kGraphs (DecoderModelImpl::wrap_blocks), inside every other wrapper: it
// calls the layer's own forward. Not for layers whose forward talks to other ranks (sequence
// parallelism), offloads to the host, or restores the RNG inside the layer (tiled MLP, selective
// checkpointing): the caller (lib/train/graphs_choice.h) keeps graphs off there. One thread at a
// time (the forward's, or autograd's in backward).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "model/blocks.h"

namespace dstrain::model {

// A recorded sequence of device work, run again by replay() at the same addresses.
class Recording {
 public:
  virtual ~Recording() = default;
  virtual void replay() = 0;
};

// Makes recordings: CUDA graphs (cuda_graph_recorder), or replaying_recorder() in tests.
class Recorder {
 public:
  virtual ~Recorder() = default;
  // Whether recordings can hold work on `x`'s device.
  virtual bool supports(const torch::Tensor& x) const = 0;
  // Runs `body` once, for real, where recordings are made (lazy initialisations happen here).
  virtual void warm_up(const std::function<void()>& body) = 0;
  // Records the work `body` queues (on CUDA it is not run: replay() runs it). Recordings with the
  // same `pool` share memory and must replay in the order recorded. Throws when the work cannot be
  // recorded, with nothing of the attempt left behind.
  virtual std::unique_ptr<Recording> record(const std::function<void()>& body, int pool) = 0;
  // Device memory the recordings' pools hold now (reserved, in use or not); 0 where none.
  virtual int64_t pool_bytes() const { return 0; }
  // Runs `fn` and returns the seconds it took, the device work it queued included: the host clock
  // read around it, after synchronize() each time (the first-use timing).
  virtual double time(const std::function<void()>& fn);
  // Waits until the work queued so far (eager kernels, replays) has run. Nothing where work runs
  // as it is queued (the CPU).
  virtual void synchronize() {}
};

// CUDA graphs on `device`, recorded and replayed on the current stream. A capture cannot run on
// the device's default (legacy) stream: where that is current, a side stream records, fenced by
// events on both sides. Error(kNotImplemented) in a build without CUDA.
std::shared_ptr<Recorder> cuda_graph_recorder(const torch::Device& device);

// One non-default stream of a CUDA device, current on the constructing thread for the object's
// lifetime (the previous one current again after). A run that records graphs trains on it from
// before its engine exists: the gradient accumulators the engine creates, the replays, the
// recordings and the accumulation into .grad are then ordered on one stream, and a backward
// recording waits on no other stream (a capture cannot). Nothing on the CPU.
class TrainingStream {
 public:
  explicit TrainingStream(const torch::Device& device);
  ~TrainingStream();
  TrainingStream(const TrainingStream&) = delete;
  TrainingStream& operator=(const TrainingStream&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A recorder whose recordings run their body again: every replay recomputes into the same static
// buffers, with the same bookkeeping as a graph. On any device; for tests of everything around the
// recording.
std::shared_ptr<Recorder> replaying_recorder();

struct LayerGraphOptions {
  // Activation checkpointing wraps the layers: a forward under grad is the recompute, followed at
  // once by its backward.
  bool recompute_follows = false;
  // Input shapes recorded (per layer); layers run eagerly for others.
  int max_shapes = 4;
  // Once the recordings' pools hold more than this (Recorder::pool_bytes()), nothing more is
  // recorded: the layers not recorded yet run eagerly, with one warning. 0: no budget.
  int64_t pool_budget = 0;
  // Keep the recordings only where they pay: at the first take_fallbacks() after recordings were
  // made, when the first-use replays took more than 1/min_speedup of the eager runs' time (summed
  // over the layers), every recorded layer falls back (FallbackCause::kNoGain). 0: no such rule.
  double min_speedup = 0;
};

struct LayerGraphStats {
  int64_t recordings = 0;    // forward and backward recordings made
  int64_t replays = 0;       // (the first-use check's replays not counted)
  int64_t eager_calls = 0;   // training-mode layer calls that ran eagerly while enabled
  int64_t eager_layers = 0;  // layers that run eagerly for good after a fallback
  std::string failure;       // why recording stopped ("" while it works)
  // The first-use check's timings, summed over the recordings that passed it: the second eager
  // run and a replay of the same work (forward, and backward where recorded), each between two
  // Recorder::synchronize() calls.
  double first_use_eager_seconds = 0, first_use_replay_seconds = 0;
};

enum class FallbackCause {
  kReplayDiffers = 1,
  kParameterMoved = 2,
  kSecondForward = 3,
  kNoGain = 4,  // LayerGraphOptions::min_speedup not reached
};

// A layer this rank stopped replaying (see above).
struct LayerFallback {
  size_t layer = 0;  // its block index
  FallbackCause cause = FallbackCause::kReplayDiffers;
  // kReplayDiffers: the worst tensor's max |replay - eager| and its bound; kNoGain: the first-use
  // replays' seconds (LayerGraphStats) and the most that pays, the eager runs' over min_speedup
  // (the same for every layer).
  double error = 0, bound = 0;
  std::string detail;  // the tensor (kReplayDiffers) or parameter (kParameterMoved) concerned
};

// "its replay differed from the eager run", "a parameter it reads moved", ...
std::string fallback_cause_text(FallbackCause cause);

class LayerGraphs {
 public:
  LayerGraphs(std::shared_ptr<Recorder> recorder, LayerGraphOptions options);
  ~LayerGraphs();
  LayerGraphs(const LayerGraphs&) = delete;
  LayerGraphs& operator=(const LayerGraphs&) = delete;

  // The wrapper to install (see above); it refers to this object, which must outlive the model.
  BlockWrapper wrapper();
  // While false, layers run eagerly and nothing is recorded (trial steps of other shapes).
  void set_enabled(bool enabled);
  LayerGraphStats stats() const;
  // Recorder::pool_bytes() of the recorder: what the recordings' memory pools hold.
  int64_t pool_bytes() const;
  // The fallbacks since the last call (each layer once); the first call after recordings were
  // made also applies LayerGraphOptions::min_speedup.
  std::vector<LayerFallback> take_fallbacks();
  // These layers (block indices) run eagerly from now on; their recordings are freed.
  void run_eagerly(const std::vector<size_t>& layers);
  // A block's name as the wrapper saw it ("block <index>" for one it has not seen).
  std::string block_name(size_t index) const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dstrain::model
