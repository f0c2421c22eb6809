#pragma once
// Collectives as autograd functions, for parallelism applied from outside the model (sequence
// parallelism's all-to-alls around attention, its loss reduction; tensor parallelism's regions).
// Each forward waits for its collective (Work::wait: on NCCL the compute stream waits, the host
// does not), and so does each backward. Every rank of `comm` must run the same forward and backward
// in the same order, which holds when they run the same model on same-shaped inputs; `comm` must
// outlive the graph.

#include <torch/torch.h>

#include "comm/communicator.h"

namespace dstrain::comm {

// x: [N, ...] with N = comm.world_size(). Row j goes to rank j; row i of the result came from rank
// i (the equal-split all_to_all). Backward: the same exchange of the gradient, since an equal-split
// all-to-all is its own inverse.
torch::Tensor all_to_all(Communicator& comm, const torch::Tensor& x);
// x [Σ send, ...]: rows send[j] of it (in rank order) go to rank j, and the result holds the
// receive[i] rows rank i sent this rank, in rank order (Communicator::all_to_all_v). Backward:
// the gradient's rows sent back the way they came (the splits swapped).
torch::Tensor all_to_all_v(Communicator& comm, const torch::Tensor& x, std::vector<int64_t> receive,
                           std::vector<int64_t> send);

// The sum of x over the ranks. Backward: the sum of the ranks' gradients, as every rank's result
// depends on every rank's x (so a loss each rank computes from the sum gets its full gradient).
torch::Tensor all_reduce_sum(Communicator& comm, const torch::Tensor& x);

// Tensor parallelism's regions (Megatron-LM's f and g), for a layer whose weights are split over
// `comm`'s ranks: a column-parallel matmul between enter_parallel and a row-parallel one before
// leave_parallel computes the whole layer on every rank.
// enter_parallel: forward the identity (every rank computes on the same x); backward the sum of
// the ranks' gradients (each shard contributes its part of x's gradient).
torch::Tensor enter_parallel(Communicator& comm, const torch::Tensor& x);
// leave_parallel: forward the sum over the ranks (the row-parallel matmul's partial products);
// backward the identity.
torch::Tensor leave_parallel(Communicator& comm, const torch::Tensor& x);

// Megatron's sequence parallelism in that region: the tokens outside it split over the ranks by
// rows (dimension 0, in rank order).
// gather_rows: x [n, ...] of each rank → [world · n, ...] (rank r's rows r·n ...); backward the
// reduce-scatter (sum) of the gradient, each rank its own rows.
torch::Tensor gather_rows(Communicator& comm, const torch::Tensor& x);
// reduce_scatter_rows: x [world · n, ...] → the sum over the ranks of rows r·n ... of rank r;
// backward the all-gather of the gradient.
torch::Tensor reduce_scatter_rows(Communicator& comm, const torch::Tensor& x);

}  // namespace dstrain::comm
