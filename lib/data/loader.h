#pragma once
// Loaders turn a SampleSet into micro-batches, built ahead on a background thread (prefetch.h).
//
// Loader (training) walks (epoch, step, micro_step) forever, epoch after epoch, using the
// DistributedSampler's order (see sampler.h for which samples each rank gets). The trainer decides
// when to stop. Its position is a LoaderState: the position of the next batch next() will return.
// Saving state() and constructing a Loader from it (or calling restore()) continues with exactly
// that next batch. A state saved with another global batch size or dataset size is refused.
//
// EvalLoader runs one pass over an eval set, sharded as described in eval_sampler.h.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/stateful.h"
#include "data/batch.h"
#include "data/eval_sampler.h"
#include "data/prefetch.h"
#include "data/sampler.h"
#include "data/samples.h"

namespace dstrain::data {

struct LoaderOptions {
  int64_t micro_batch = 1;
  int64_t accum_steps = 1;
  int64_t world_size = 1;
  int64_t rank = 0;
  uint64_t seed = 42;
  bool shuffle = true;
  bool drop_last = true;
  bool pin_memory = false;  // pinned host tensors when CUDA is available; ignored otherwise
  int64_t prefetch = 2;     // micro-batches built ahead (queue capacity)
};

struct LoaderState {
  int64_t epoch = 0;
  int64_t step = 0;          // optimizer step within the epoch
  int64_t micro_step = 0;    // micro-step within the step (0 at a step boundary)
  int64_t global_batch = 0;  // G it was saved with (0 = unknown, not checked)
  int64_t num_samples = 0;   // dataset size it was saved with (0 = unknown, not checked)
};

// {"epoch":..,"step":..,"micro_step":..,"global_batch":..,"num_samples":..}
std::string loader_state_to_json(const LoaderState& state);
// Error(kInput) naming `origin` (e.g. the checkpoint file) for malformed JSON or missing keys.
LoaderState loader_state_from_json(std::string_view json, const std::string& origin);

// A checkpoint component (ckpt/stateful.h): its state is the LoaderState. Restored with another
// global batch (another world size), it continues the saved epoch at the step that has seen as
// many samples, with a warning.
class Loader : public ckpt::Stateful {
 public:
  // Error(kInput) when the dataset is smaller than one global batch, or `start` was saved for
  // another global batch or dataset size; Error(kConfig) for bad sizes.
  Loader(std::shared_ptr<const SampleSet> samples, const LoaderOptions& options,
         const LoaderState& start = {});
  ~Loader() override;

  // The next micro-batch of this rank. Rethrows an error raised while building it.
  Batch next();
  // Position of the batch the next call to next() returns.
  LoaderState state() const;
  // Drops prefetched batches and continues from `state` (same checks as the constructor).
  void restore(const LoaderState& state);

  int state_version() const override { return 1; }
  ckpt::State snapshot_state(ckpt::Snapshot how) const override;
  void restore_state(const ckpt::StateIn& in) override;

  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t global_batch() const { return global_batch_; }

 private:
  void start(const LoaderState& state);

  std::shared_ptr<const SampleSet> samples_;
  LoaderOptions options_;
  SamplerOptions sampler_options_;
  int64_t steps_per_epoch_ = 0;
  int64_t global_batch_ = 0;
  LoaderState next_;  // consumer position
  std::unique_ptr<Prefetcher<Batch>> prefetcher_;
};

class EvalLoader {
 public:
  EvalLoader(std::shared_ptr<const SampleSet> samples, int64_t micro_batch, int64_t world_size,
             int64_t rank, bool pin_memory = false, int64_t prefetch = 2);
  ~EvalLoader();

  int64_t num_batches() const { return sampler_.num_batches(); }
  // The next eval batch (step = batch index), or nullopt after the last one.
  std::optional<Batch> next();

 private:
  std::shared_ptr<const SampleSet> samples_;
  EvalSampler sampler_;
  std::unique_ptr<Prefetcher<Batch>> prefetcher_;
};

}  // namespace dstrain::data
