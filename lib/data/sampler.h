#pragma once
// Deterministic distributed sampling for training.
//
// Epoch e orders the N samples by a permutation P_e: a Fisher-Yates shuffle driven by a SplitMix64
// generator seeded from (seed, e) — our own code, so the order is the same with every standard
// library — or the identity when shuffle is off. With global batch G = micro × accum × world, step
// s of epoch e consumes the block P_e[s*G .. s*G + G). Inside that block, rank r at micro-step k
// gets
//
//     P_e[s*G + k*(world*micro) + r*micro + b]   for b = 0 .. micro-1.
//
// Properties (tested):
//  - ranks' slices are disjoint and together cover the block of each step;
//  - the SET of samples of one optimizer step depends only on (seed, epoch, step, G), not on world
//    size: a single-process run with accum = world × accum' sees the same data per step as a
//    multi-rank run, and a run can resume at another world size with the same global batch;
//  - steps_per_epoch = floor(N/G) with drop_last; with drop_last off it is ceil(N/G) and the last
//    step is completed with samples from the start of P_e (as PyTorch's DistributedSampler pads).
// A dataset with fewer than G samples is Error(kInput): there is not one full step to train on.

#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::data {

struct SamplerOptions {
  int64_t num_samples = 0;
  int64_t micro_batch = 1;  // samples per rank per micro-step
  int64_t accum_steps = 1;  // micro-steps per optimizer step
  int64_t world_size = 1;
  int64_t rank = 0;
  uint64_t seed = 42;
  bool shuffle = true;
  bool drop_last = true;
  std::string dataset_name;  // for error messages
};

// The permutation P_e of [0, n) described above.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

class DistributedSampler {
 public:
  // Error(kConfig) for non-positive sizes or a rank outside [0, world_size); Error(kInput) when the
  // dataset holds fewer samples than one global batch.
  explicit DistributedSampler(const SamplerOptions& options);

  int64_t global_batch() const { return global_batch_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  const SamplerOptions& options() const { return options_; }

  // Builds P_epoch (cheap to call again with the same epoch).
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  // This rank's `micro_batch` sample indices for micro-step `micro_step` of step `step`.
  std::vector<int64_t> micro_batch_indices(int64_t step, int64_t micro_step) const;
  // All G sample indices of step `step` in block order (every rank's, every micro-step's).
  std::vector<int64_t> step_indices(int64_t step) const;

 private:
  int64_t position(int64_t step, int64_t offset) const;

  SamplerOptions options_;
  int64_t global_batch_ = 0;
  int64_t steps_per_epoch_ = 0;
  int64_t epoch_ = -1;
  std::vector<int64_t> permutation_;
};

}  // namespace dstrain::data
