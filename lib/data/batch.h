#pragma once
// A micro-batch as the trainer consumes it: int64 tensors on the CPU (pinned when asked for and a
// CUDA device exists, so the host-to-device copy can be non_blocking).

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "data/samples.h"

namespace dstrain::data {

struct Batch {
  torch::Tensor input_ids;  // [B, T] int64
  torch::Tensor labels;     // [B, T] int64; -100 = no loss at this position
  int64_t epoch = 0;        // train: position of this batch; eval: epoch 0, step = batch index
  int64_t step = 0;
  int64_t micro_step = 0;       // train: which micro-step of the optimizer step, 0-based
  int64_t micro_steps = 1;      // train: micro-steps per optimizer step (gradient accumulation)
  bool last_micro_step = true;  // train: this micro-batch completes an optimizer step
  int64_t num_rows = 0;         // rows holding real samples; eval filler rows come after them
  int64_t tokens = 0;           // positions holding a document's token (the rest is padding)
  int64_t labelled = 0;         // positions whose label is not -100 (those the loss counts)
  // Per row, how many of its first positions hold a document's token (the rest is padding).
  std::vector<int64_t> row_tokens;
  // Packed whole documents (SampleOptions::documents): per row the lengths of its documents,
  // summing to T (a filler row: one of T); empty otherwise.
  std::vector<std::vector<int64_t>> documents;
};

// Fills a batch with the samples `indices` (one row each; -1 = filler row: pad ids, labels -100).
// `pin_memory` is honoured only when CUDA is available (a no-op on CPU-only builds and machines).
Batch collate(const SampleSet& samples, const std::vector<int64_t>& indices, bool pin_memory);

}  // namespace dstrain::data
