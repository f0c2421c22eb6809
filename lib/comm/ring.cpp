#include "comm/ring.h"

namespace dstrain::comm {
namespace {

// Sends `out` to `next` while receiving `in` from `prev`; returns when both are done.
void exchange(c10d::Backend& group, const at::Tensor& out, int next, at::Tensor in, int prev,
              int tag) {
  std::vector<at::Tensor> recv_tensors{std::move(in)};
  std::vector<at::Tensor> send_tensors{out};
  auto recv = group.recv(recv_tensors, prev, tag);
  auto send = group.send(send_tensors, next, tag);
  recv->wait();
  send->wait();
}

void combine(at::Tensor& dst, const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    at::maximum_out(dst, a, b);
  } else {
    at::add_out(dst, a, b);
  }
}

}  // namespace

void ring_reduce_scatter(c10d::Backend& group, at::Tensor output, const at::Tensor& input,
                         ReduceOp op, int tag) {
  const int n = group.getSize();
  const int r = group.getRank();
  const int64_t chunk = output.numel();
  auto piece = [&](int i) { return input.narrow(0, static_cast<int64_t>(i) * chunk, chunk); };
  // Invariant: before step s, `outgoing` holds the partial sum of chunk (r - s - 1) over ranks
  // r - s .. r; the chunk received in step s is (r - s - 2), to which this rank adds its own.
  at::Tensor outgoing = piece((r - 1 + n) % n);
  at::Tensor incoming = at::empty_like(output);
  at::Tensor partial = n > 2 ? at::empty_like(output) : output;
  for (int s = 0; s < n - 1; ++s) {
    exchange(group, outgoing, (r + 1) % n, incoming, (r - 1 + n) % n, tag + s);
    at::Tensor dst = (s == n - 2) ? output : partial;
    combine(dst, incoming, piece(((r - s - 2) % n + n) % n), op);
    outgoing = dst;
  }
}

}  // namespace dstrain::comm
