#pragma once
// Eval sharding: every sample evaluated exactly once, nothing dropped, no shuffle.
//
// Eval batch j covers the block [j*W*B, (j+1)*W*B) of sample indices (W = world size, B = micro
// batch); rank r gets [j*W*B + r*B, j*W*B + r*B + B). Every rank runs the same number of batches,
// ceil(N / (W*B)), so collectives inside the forward pass (ZeRO-3 gathers) stay matched. Positions
// at or past N in the last block are filler rows (index -1): input_ids = pad, labels all -100, so
// they add nothing to the loss sum or the token count. The mean eval loss is then
// sum(loss over labelled tokens) / count(labelled tokens), each summed over ranks.

#include <cstdint>
#include <vector>

namespace dstrain::data {

class EvalSampler {
 public:
  // Error(kConfig) for non-positive sizes or a rank outside [0, world_size).
  EvalSampler(int64_t num_samples, int64_t micro_batch, int64_t world_size, int64_t rank);

  int64_t num_batches() const { return num_batches_; }
  // B indices for eval batch `batch` on this rank; -1 marks a filler row.
  std::vector<int64_t> batch_indices(int64_t batch) const;

 private:
  int64_t num_samples_, micro_batch_, world_size_, rank_, num_batches_;
};

}  // namespace dstrain::data
