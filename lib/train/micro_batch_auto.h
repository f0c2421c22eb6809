#pragma once
// training.per_device_train_batch_size: auto — the largest micro-batch that fits the device, with
// the gradient accumulation that keeps micro × accumulation × data-parallel ranks exactly the
// user's global batch.
//
// The loaded config gives the samples S each data-parallel rank takes per step (config.h,
// micro_batch_auto); the candidates are the divisors of S, so every choice keeps the global batch.
// The largest whose predicted peak fits the limit is taken. The peak: the model states of the
// run's ZeRO stage (estimate/model_states.h) plus one micro-batch's activations with the run's
// checkpointing (estimate/activations.h; with gradient_checkpointing: auto, the first setting of
// that choice's order under which some micro-batch fits, plan_for_run() in run_plan.h). The limit
// is train::planning_limit() (memory_limit.h), read once: kHeadroom of the memory_per_rank() — the
// free GPU memory, or the host's MemAvailable, shared by the LOCAL_WORLD_SIZE ranks that use one
// memory (the CPU ranks of a host, the --share-gpu ranks of one GPU) — the smallest over the
// ranks, so every rank plans the same. Every rank then runs one trial step at that size (the
// Trainer, trainer_micro_batch.cpp), which confirms it or, out of memory, moves to the next
// divisor down.
//
// Losses: a micro-step's loss is the mean over its tokens and a step averages its micro-steps.
// With packing (the default) every sample has max_length tokens, so any split of a step gives the
// mean over its samples: the user's own split's loss, up to float rounding. Without packing,
// padding makes samples' token counts differ and the split changes their weights, as any change
// of micro-batch does.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/checkpointing.h"

namespace dstrain::train {

struct MicroBatchPlan {
  int64_t samples = 1;    // S: samples per data-parallel rank per step
  int64_t micro = 1;      // the choice, a divisor of S
  int64_t peak = 0;       // predicted bytes per rank at `micro`
  int64_t full_peak = 0;  // predicted bytes per rank at micro-batch S (no accumulation)
  int64_t limit = 0;
  bool fits = true;  // false: not even micro-batch 1 is predicted to fit (1 is taken, and tried)
  // The activation checkpointing the peaks are predicted with (plan_for_run()).
  model::Checkpointing checkpointing = model::Checkpointing::kNone;
  int64_t accumulation() const { return samples / micro; }
  bool memory_bound() const { return micro < samples; }
};

// The divisors of n >= 1, largest first.
std::vector<int64_t> divisors_descending(int64_t n);

// The largest divisor of `samples` whose peak_of(divisor) is at most `limit`; none fitting, 1
// with fits = false.
MicroBatchPlan plan_micro_batch(int64_t samples, const std::function<int64_t(int64_t)>& peak_of,
                                int64_t limit);

// Micro-batch `micro` for `t` (whose micro_batch_auto is set, micro × accumulation = S): micro ×
// S / micro, marked chosen, and train_batch_size the global batch S × `data_parallel`, so that the
// config the run records keeps the global batch when it resumes on another world size.
// Error(kInternal) when `micro` does not divide S.
void apply_micro_batch(config::TrainingSection& t, int64_t micro, int64_t data_parallel);

// The samples per rank per step S of an auto config, chosen or not.
int64_t samples_per_rank(const config::TrainingSection& t);

// The start-up line: "micro-batch auto: 8 × accumulation 1 = global 8, fits in 21.3 GiB of 72.0
// GiB (predicted peak per rank)", and when memory bounds the choice what micro-batch S would need.
std::string describe_plan(const MicroBatchPlan& plan, int64_t data_parallel);

}  // namespace dstrain::train
