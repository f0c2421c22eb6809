#pragma once
// Bucketed gradient communication during backward (one instance per engine).
//
// Buckets (see partition.h) are launched strictly from the last to the first: backward produces
// gradients roughly in reverse parameter order, and every rank must issue its collectives in the
// same order whatever order its hooks fire in. A bucket is launched once all its parameters have
// reported (overlap_comm) or at the end of backward, whichever comes first in that order.
//
//   stage 0: all_reduce(avg) of the bucket's range of the flat gradient buffer, in place.
//   stage 1: reduce_scatter(avg) of that range into this rank's chunk of the gradient shard.
//   stage 2: there is no flat gradient buffer. When a parameter's gradient is final, its elements
//            are copied into transient bucket-sized buffers and .grad is released
//            (contiguous_gradients; otherwise .grad is kept until its bucket is launched and copied
//            then). Each bucket is reduce-scattered into the shard; on later micro-steps of an
//            accumulation into a temporary chunk that is added to the shard when it completes.
// At most `max_in_flight` collectives are outstanding; launching more first completes the oldest,
// which bounds the transient buffers to a few buckets. Without overlap_comm every collective is
// completed as soon as it is launched.

#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "comm/communicator.h"
#include "zero/partition.h"

namespace dstrain::zero {

struct GradReducerConfig {
  int stage = 0;
  bool overlap_comm = true;
  bool contiguous_gradients = true;
  size_t max_in_flight = 2;
};

class GradReducer {
 public:
  // `params`: the engine's parameters in partition order (their .grad is read at stage 2).
  GradReducer(const Partition& partition, comm::Communicator& comm,
              std::vector<torch::Tensor> params, GradReducerConfig config);

  // Stage 0/1: the flat gradient buffer [padded_numel] whose views are the parameters' .grad.
  void set_flat_grad(torch::Tensor flat_grad) { flat_grad_ = std::move(flat_grad); }
  // Stage 1/2: this rank's gradient shard [shard_numel] that reduced chunks land in. It may live
  // elsewhere than the gradients (the host, in fp32, with offload_optimizer): each bucket's chunk
  // is then reduced into a transient buffer like the gradients and streamed into the shard as its
  // collective completes, during backward.
  void set_grad_shard(torch::Tensor grad_shard) { grad_shard_ = std::move(grad_shard); }

  // Called with a bucket's index once its reduced gradient is in place (the flat buffer's range at
  // stage 0, this rank's chunk of the shard at stages 1/2, added to it when accumulating), for the
  // buckets of a backward begun with `notify`: during backward, in the order the buckets were
  // launched, or from finish().
  void set_on_reduced(std::function<void(size_t bucket)> on_reduced) {
    on_reduced_ = std::move(on_reduced);
  }

  // `communicate`: reduce this backward's gradients (stage 0/1: last micro-step only).
  // `accumulate`: stage 2, add into the shard instead of overwriting it.
  // `notify`: call on_reduced for this backward's buckets (the step's last micro-step).
  void begin_backward(bool communicate, bool accumulate, bool notify = false);
  // Hook: parameter `param`'s gradient is final for this backward.
  void on_grad_ready(size_t param);
  // Launches the buckets not launched yet (parameters that got no gradient count as zero).
  void end_backward();
  // Completes every outstanding collective; afterwards the reduced gradients are in place.
  void finish();

  int64_t held_bytes() const;  // transient buffers held now
  int64_t peak_bytes() const { return peak_bytes_; }

 private:
  struct InFlight {
    std::unique_ptr<comm::Work> work;
    torch::Tensor input;  // kept alive until the collective completes
    torch::Tensor output;
    torch::Tensor target;  // defined: output is added (or copied) here on completion
    bool assign = false;   // copy into target instead of adding
    bool notify = false;   // call on_reduced_ once complete
    int64_t bucket = 0;
  };

  // The device and dtype of the gradients (and of every communication buffer).
  torch::TensorOptions grad_options() const;
  // The chunk of the shard bucket `bucket` reduces into, as `op`'s output or target.
  void route_output(InFlight& op, Range chunk_in_shard) const;

  void launch_ready();
  void launch(size_t bucket);
  void launch_stage2(size_t bucket, Range chunk_in_shard);
  torch::Tensor& bucket_buffer(size_t bucket);
  void copy_grad_into_buffers(size_t param);
  void copy_bucket_from_grads(size_t bucket);
  void retire_oldest();
  void note_allocation();

  const Partition& partition_;
  comm::Communicator& comm_;
  std::vector<torch::Tensor> params_;
  GradReducerConfig config_;
  torch::Tensor flat_grad_;
  torch::Tensor grad_shard_;

  std::vector<int> params_per_bucket_;  // non-empty parameters overlapping each bucket
  std::vector<int> waiting_;            // of those, not yet reported in this backward
  int64_t next_launch_ = -1;            // next bucket to launch (descending); -1: all launched
  bool active_ = false;
  bool accumulate_ = false;
  bool notify_ = false;
  std::function<void(size_t)> on_reduced_;
  std::map<size_t, torch::Tensor> buffers_;  // stage 2: bucket buffers being filled
  std::deque<InFlight> in_flight_;
  int64_t peak_bytes_ = 0;
};

}  // namespace dstrain::zero
