#pragma once
// Collectives as autograd functions, for parallelism applied from outside the model (sequence
// parallelism's all-to-alls around attention, its loss reduction). Each forward waits for its
// collective (Work::wait: on NCCL the compute stream waits, the host does not), and so does each
// backward. Every rank of `comm` must run the same forward and backward in the same order, which
// holds when they run the same model on same-shaped inputs; `comm` must outlive the graph.

#include <torch/torch.h>

#include "comm/communicator.h"

namespace dstrain::comm {

// x: [N, ...] with N = comm.world_size(). Row j goes to rank j; row i of the result came from rank
// i (the equal-split all_to_all). Backward: the same exchange of the gradient, since an equal-split
// all-to-all is its own inverse.
torch::Tensor all_to_all(Communicator& comm, const torch::Tensor& x);

// The sum of x over the ranks. Backward: the sum of the ranks' gradients, as every rank's result
// depends on every rank's x (so a loss each rank computes from the sum gets its full gradient).
torch::Tensor all_reduce_sum(Communicator& comm, const torch::Tensor& x);

}  // namespace dstrain::comm
