// The communicator rides in the autograd context as an address: contexts hold only IValues, and
// the contract above keeps it alive while the graph is.

#include "comm/autograd.h"

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/trace.h"

namespace dstrain::comm {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The buffers go to the communicator detached: its work may run on another thread, where grad
// mode is on and an op on a tensor that requires grad would be recorded (or refused).

torch::Tensor exchange(Communicator& comm, const torch::Tensor& x) {
  torch::Tensor input = x.detach().contiguous();
  torch::Tensor output = torch::empty_like(input);
  comm.all_to_all(output, input)->wait();
  return output;
}

torch::Tensor sum(Communicator& comm, const torch::Tensor& x) {
  torch::Tensor out = x.detach().contiguous().clone();
  comm.all_reduce(out, ReduceOp::kSum)->wait();
  return out;
}

// [world · n, ...] of every rank's x [n, ...], in rank order.
torch::Tensor gather(Communicator& comm, const torch::Tensor& x) {
  torch::Tensor input = x.detach().contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] *= comm.world_size();
  torch::Tensor output = torch::empty(shape, input.options());
  // The communicators take flat buffers.
  torch::Tensor flat = output.view({-1});
  comm.all_gather(flat, input.view({-1}))->wait();
  return output;
}

// Rank r's rows of x [world · n, ...] summed over the ranks.
torch::Tensor scatter(Communicator& comm, const torch::Tensor& x) {
  torch::Tensor input = x.detach().contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  if (shape.empty() || shape[0] % comm.world_size() != 0) {
    fail(ErrorKind::kInternal, "reduce_scatter_rows: {} rows over {} ranks",
         shape.empty() ? 0 : shape[0], comm.world_size());
  }
  shape[0] /= comm.world_size();
  torch::Tensor output = torch::empty(shape, input.options());
  torch::Tensor flat = output.view({-1});
  comm.reduce_scatter(flat, input.view({-1}), ReduceOp::kSum)->wait();
  return output;
}

// x's rows sent by `send` splits, received by `receive` splits (all_to_all_v).
torch::Tensor exchange_rows(Communicator& comm, const torch::Tensor& x,
                            const std::vector<int64_t>& receive, const std::vector<int64_t>& send) {
  torch::Tensor input = x.detach().contiguous();
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] = 0;
  for (int64_t rows : receive) shape[0] += rows;
  torch::Tensor output = torch::empty(shape, input.options());
  const trace::Span span("comm", "all_to_all_v", {"rows", shape[0]});
  comm.all_to_all_v(output, input, receive, send)->wait();
  return output;
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

struct AllToAllV : torch::autograd::Function<AllToAllV> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm,
                               std::vector<int64_t> receive, std::vector<int64_t> send) {
    keep_comm(ctx, *comm);
    torch::Tensor out = exchange_rows(*comm, x, receive, send);
    ctx->saved_data["receive"] = std::move(receive);
    ctx->saved_data["send"] = std::move(send);
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The inverse exchange: what came from rank i goes back to it.
    const std::vector<int64_t> receive = ctx->saved_data["receive"].toIntVector();
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    return {exchange_rows(comm_of(ctx), grads[0], send, receive), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
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

struct EnterParallel : torch::autograd::Function<EnterParallel> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm) {
    keep_comm(ctx, *comm);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {sum(comm_of(ctx), grads[0]), torch::Tensor()};
  }
};

struct LeaveParallel : torch::autograd::Function<LeaveParallel> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, Communicator* comm) {
    return sum(*comm, x);
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], torch::Tensor()};
  }
};

struct GatherRows : torch::autograd::Function<GatherRows> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm) {
    keep_comm(ctx, *comm);
    return gather(*comm, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {scatter(comm_of(ctx), grads[0]), torch::Tensor()};
  }
};

struct ReduceScatterRows : torch::autograd::Function<ReduceScatterRows> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, Communicator* comm) {
    keep_comm(ctx, *comm);
    return scatter(*comm, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gather(comm_of(ctx), grads[0]), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor enter_parallel(Communicator& comm, const torch::Tensor& x) {
  if (comm.world_size() == 1) return x;
  return EnterParallel::apply(x, &comm);
}

torch::Tensor leave_parallel(Communicator& comm, const torch::Tensor& x) {
  if (comm.world_size() == 1) return x;
  return LeaveParallel::apply(x, &comm);
}

torch::Tensor gather_rows(Communicator& comm, const torch::Tensor& x) {
  if (comm.world_size() == 1) return x;
  return GatherRows::apply(x, &comm);
}

torch::Tensor reduce_scatter_rows(Communicator& comm, const torch::Tensor& x) {
  if (comm.world_size() == 1) return x;
  return ReduceScatterRows::apply(x, &comm);
}

torch::Tensor all_to_all(Communicator& comm, const torch::Tensor& x) {
  if (comm.world_size() == 1) return x;
  return AllToAll::apply(x, &comm);
}

torch::Tensor all_to_all_v(Communicator& comm, const torch::Tensor& x, std::vector<int64_t> receive,
                           std::vector<int64_t> send) {
  if (comm.world_size() == 1) return x;
  return AllToAllV::apply(x, &comm, std::move(receive), std::move(send));
}

torch::Tensor all_reduce_sum(Communicator& comm, const torch::Tensor& x) {
  if (comm.world_size() == 1) return x;
  return AllReduceSum::apply(x, &comm);
}

}  // namespace dstrain::comm
