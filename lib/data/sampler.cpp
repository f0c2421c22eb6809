#include "data/sampler.h"

#include <numeric>

#include "core/error.h"

namespace dstrain::data {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (rejection of the short tail).
uint64_t uniform_below(uint64_t& state, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t x;
  do {
    x = splitmix64(state);
  } while (x >= limit);
  return x % bound;
}

void check_positive(int64_t value, const char* what) {
  if (value < 1) fail(ErrorKind::kConfig, "{} must be at least 1, got {}", what, value);
}

}  // namespace

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  if (!shuffle) return perm;
  uint64_t state = seed;
  state = splitmix64(state) ^ (static_cast<uint64_t>(epoch) * 0xD1B54A32D192ED03ull);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(uniform_below(state, static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

DistributedSampler::DistributedSampler(const SamplerOptions& options) : options_(options) {
  check_positive(options.micro_batch, "micro batch size (per_device_train_batch_size)");
  check_positive(options.accum_steps, "gradient_accumulation_steps");
  check_positive(options.world_size, "world size");
  if (options.rank < 0 || options.rank >= options.world_size) {
    fail(ErrorKind::kConfig, "rank {} is outside [0, {})", options.rank, options.world_size);
  }
  global_batch_ = options.micro_batch * options.accum_steps * options.world_size;
  const int64_t n = options.num_samples;
  if (n < global_batch_) {
    fail(ErrorKind::kInput,
         "{}: the dataset has {} samples but one global batch needs {} (micro batch {} x "
         "gradient accumulation {} x data-parallel ranks {}); add data or lower the batch size",
         options.dataset_name, n, global_batch_, options.micro_batch, options.accum_steps,
         options.world_size);
  }
  steps_per_epoch_ =
      options.drop_last ? n / global_batch_ : (n + global_batch_ - 1) / global_batch_;
}

void DistributedSampler::set_epoch(int64_t epoch) {
  if (epoch == epoch_) return;
  permutation_ = epoch_permutation(options_.num_samples, options_.seed, epoch, options_.shuffle);
  epoch_ = epoch;
}

int64_t DistributedSampler::position(int64_t step, int64_t offset) const {
  if (epoch_ < 0) fail(ErrorKind::kInternal, "DistributedSampler used before set_epoch()");
  if (step < 0 || step >= steps_per_epoch_) {
    fail(ErrorKind::kInternal, "step {} outside [0, {})", step, steps_per_epoch_);
  }
  // Only reachable without drop_last: wrap to the start of the permutation.
  return permutation_[(step * global_batch_ + offset) % options_.num_samples];
}

std::vector<int64_t> DistributedSampler::micro_batch_indices(int64_t step,
                                                             int64_t micro_step) const {
  const int64_t b = options_.micro_batch;
  const int64_t base = micro_step * options_.world_size * b + options_.rank * b;
  std::vector<int64_t> out(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) out[i] = position(step, base + i);
  return out;
}

std::vector<int64_t> DistributedSampler::step_indices(int64_t step) const {
  std::vector<int64_t> out(static_cast<size_t>(global_batch_));
  for (int64_t i = 0; i < global_batch_; ++i) out[i] = position(step, i);
  return out;
}

}  // namespace dstrain::data
