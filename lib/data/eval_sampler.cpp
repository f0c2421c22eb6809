#include "data/eval_sampler.h"

#include "core/error.h"

namespace dstrain::data {

EvalSampler::EvalSampler(int64_t num_samples, int64_t micro_batch, int64_t world_size, int64_t rank)
    : num_samples_(num_samples), micro_batch_(micro_batch), world_size_(world_size), rank_(rank) {
  if (micro_batch < 1 || world_size < 1 || rank < 0 || rank >= world_size || num_samples < 0) {
    fail(
        ErrorKind::kConfig,
        "eval sharding needs micro batch >= 1 and 0 <= rank < world size, got micro batch {}, rank "
        "{}, world size {}",
        micro_batch, rank, world_size);
  }
  const int64_t block = micro_batch * world_size;
  num_batches_ = (num_samples + block - 1) / block;
}

std::vector<int64_t> EvalSampler::batch_indices(int64_t batch) const {
  std::vector<int64_t> out(static_cast<size_t>(micro_batch_));
  const int64_t base = batch * world_size_ * micro_batch_ + rank_ * micro_batch_;
  for (int64_t b = 0; b < micro_batch_; ++b) {
    out[b] = base + b < num_samples_ ? base + b : -1;
  }
  return out;
}

}  // namespace dstrain::data
