// The communicator rides in the autograd context as an address: contexts hold only IValues, and
// the contract above keeps it alive while the graph is.

#include "comm/autograd.h"

#include <cstdint>

namespace dstrain::comm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

torch::Tensor exchange(Communicator& comm, const torch::Tensor& x) {
  torch::Tensor input = x.contiguous();
  torch::Tensor output = torch::empty_like(input);
  comm.all_to_all(output, input)->wait();
  return output;
}

torch::Tensor sum(Communicator& comm, const torch::Tensor& x) {
  torch::Tensor out = x.contiguous().clone();
  comm.all_reduce(out, ReduceOp::kSum)->wait();
  return out;
}

Communicator& comm_of(AutogradContext* ctx) {
  return *reinterpret_cast<Communicator*>(ctx->saved_data["comm"].toInt());
}

void keep_comm(AutogradContext* ctx, Communicator& comm) {
  ctx->saved_data["comm"] = reinterpret_cast<int64_t>(&comm);
}

struct AllToAll : torch::autograd::Function<AllToAll> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm) {
    keep_comm(ctx, *comm);
    return exchange(*comm, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {exchange(comm_of(ctx), grads[0]), torch::Tensor()};
  }
};

struct AllReduceSum : torch::autograd::Function<AllReduceSum> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm) {
    keep_comm(ctx, *comm);
    return sum(*comm, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {sum(comm_of(ctx), grads[0]), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor all_to_all(Communicator& comm, const torch::Tensor& x) {
  if (comm.world_size() == 1) return x;
  return AllToAll::apply(x, &comm);
}

torch::Tensor all_reduce_sum(Communicator& comm, const torch::Tensor& x) {
  if (comm.world_size() == 1) return x;
  return AllReduceSum::apply(x, &comm);
}

}  // namespace dstrain::comm
