#pragma once
// Ring reduce-scatter over point-to-point send/recv. ProcessGroupGloo's own reduce-scatter is an
// all-reduce followed by a slice, which sends twice the bytes ZeRO needs; the ring sends exactly
// (N-1)/N of the buffer.
//
// Rank r of N, chunk = output.numel(): in step s (0 .. N-2) rank r sends one chunk to r+1 and
// receives one from r-1, so each rank sends (N-1)·chunk elements in all. Reduction happens in the
// buffers' dtype (ATen arithmetic), as NCCL does for bf16/fp16.

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "comm/communicator.h"

namespace dstrain::comm {

// input: [N·chunk], output: [chunk], contiguous, same dtype. Rank r gets the reduction of every
// rank's chunk r (kAvg is not handled here: sum, then divide). output may alias input's chunk r.
// Uses tags [tag, tag + N - 1). Throws what Gloo throws (errors, timeouts).
void ring_reduce_scatter(c10d::Backend& group, at::Tensor output, const at::Tensor& input,
                         ReduceOp op, int tag);

}  // namespace dstrain::comm
