#pragma once
// DeepSpeed-Ulysses sequence parallelism (parallel.sequence_parallel_size = P), applied to the
// model from outside: the model only offers its AttentionCore seam and Positions (model.h).
//
// Groups (layout/parallel_layout.h): the ranks with the same pipeline, data-parallel and
// tensor-parallel coordinates, T apart under tensor parallelism of T. The ranks of a group read
// the same samples and each keeps its contiguous T/P tokens of every sequence, at their global
// positions. Labels arrive already shifted (label t is token t + 1), so slicing them keeps the
// shift global: a slice's last token is scored against the next slice's first token.
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
  // `group`: the sequence-parallel group (train/parallel_groups.h), null for a group of one. It
  // must outlive this object.
  explicit SequenceParallel(comm::Communicator* group);

  int size() const { return group_ ? group_->world_size() : 1; }  // P
  int rank() const { return group_ ? group_->rank() : 0; }        // place in the group

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
  comm::Communicator* group_;
};

// The attention core of a sequence-parallel group `group` (layers.h's contract, on this rank's
// slice): exposed for tests. q [B, H, T/P, D]; k, v [B, KV, T/P, D] → [B, H, T/P, D].
model::AttentionCore ulysses_attention(comm::Communicator& group);

}  // namespace dstrain::train
