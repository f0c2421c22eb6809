#pragma once
// DeepSpeed-Ulysses sequence parallelism (parallel.sequence_parallel_size = P), applied to the
// model from outside: the model only offers its AttentionCore seam and Positions (model.h).
//
// Groups: the world of N ranks is cut into N/P groups of P consecutive ranks (ranks 0..P-1, then
// P..2P-1, ...; the launcher places consecutive ranks on one node); with tensor parallelism of T
// (tensor_parallel.h: innermost) the P ranks of a group are T apart, and the data-parallel degree
// N/(P·T). The data-parallel degree is N/P: the ranks of a group read the same samples and each
// keeps its contiguous T/P tokens of every sequence, at their global positions. Labels arrive
// already shifted (label t is token t + 1), so slicing them keeps the shift global: a slice's last
// token is scored against the next slice's first token.
//
// Attention (Ulysses): q, k, v go from sequence-sharded [B, heads, T/P, D] to head-sharded
// [B, heads/P, T, D] by an all-to-all over the group; causal (or sliding-window) attention runs
// over the whole sequence; one all-to-all brings the output back. With fewer key/value heads than
// P, each is replicated to the P/KV ranks whose query heads use it.
//
// Loss: each rank's token-loss sum and count are summed over its group, so every rank of a group
// holds the sample's exact mean; the sum's backward sums over the group too (comm/autograd.h), so
// the engine's gradient average over all N ranks is the mean over the N/P data-parallel samples,
// exactly what N/P ranks without sequence parallelism compute. ZeRO keeps sharding over all N.

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "data/batch.h"
#include "model/model.h"

namespace dstrain::train {

class SequenceParallel {
 public:
  // Collective over `world` (it splits it) when size > 1. Error(kConfig) naming
  // parallel.sequence_parallel_size when the world size is not divisible by it (times
  // `tensor_parallel`, the tensor-parallel degree inside it).
  SequenceParallel(comm::Communicator& world, int size, int tensor_parallel = 1);

  int size() const { return size_; }                                     // P
  int rank() const { return (world_rank_ / tensor_parallel_) % size_; }  // place in the group
  // N / (P·T) and this rank's place among them.
  int data_parallel_size() const { return world_size_ / (size_ * tensor_parallel_); }
  int data_parallel_rank() const { return world_rank_ / (size_ * tensor_parallel_); }

  // Error(kConfig) naming `model`, its head counts and the key when they cannot be split P ways
  // (query heads divisible by P; key/value heads divisible by P, or dividing P).
  static void check_model(const model::ModelConfig& config, int size, const std::string& model);
  // Error(kConfig) naming data.max_length and the key when it is not divisible by P.
  static void check_length(int64_t max_length, int size);

  // Every layer's attention runs over the whole sequence through the group (a no-op for P = 1).
  // The model must not outlive this object.
  void apply(model::DecoderModelImpl& model);
  // This rank's tokens of a batch of whole sequences: columns [rank·T/P, (rank+1)·T/P).
  data::Batch slice(data::Batch batch) const;
  // Where this rank's slice of a sequence `length` long lies in it.
  model::Positions positions(int64_t length) const;
  // The group's loss: sum and count summed over the group (differentiably; see above).
  model::LossSum reduce_loss(const model::LossSum& local);

 private:
  int size_;
  int tensor_parallel_;
  int world_rank_;
  int world_size_;
  std::unique_ptr<comm::Communicator> group_;  // null when size is 1
};

// The attention core of a sequence-parallel group `group` (layers.h's contract, on this rank's
// slice): exposed for tests. q [B, H, T/P, D]; k, v [B, KV, T/P, D] → [B, H, T/P, D].
model::AttentionCore ulysses_attention(comm::Communicator& group);

}  // namespace dstrain::train
