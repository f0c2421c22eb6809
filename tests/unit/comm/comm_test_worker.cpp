// One rank of a comm test world. The gtest (gloo_communicator_test.cpp) starts N of these with
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set, naming a scenario:
//   comm_test_worker <scenario> <result-dir>
// Each rank writes <result-dir>/rank<r>.txt: "OK", or "ERROR [<kind>] <message>" when the scenario
// expects a failure. A wrong collective result prints the mismatch and exits 1.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "comm/gloo_communicator.h"
#include "core/error.h"

namespace {

using dstrain::comm::CollectiveKind;
using dstrain::comm::Communicator;
using dstrain::comm::kNoGroup;
using dstrain::comm::ReduceOp;

int g_failures = 0;

void expect_equal(const char* what, const at::Tensor& got, const at::Tensor& want) {
  if (!got.to(at::kDouble).equal(want.to(at::kDouble))) {
    std::cerr << what << ": mismatch\n got  " << got.slice(0, 0, 8) << "\n want "
              << want.slice(0, 0, 8) << "\n";
    ++g_failures;
  }
}

void expect_bytes(const Communicator& comm, CollectiveKind kind, uint64_t want) {
  uint64_t got = comm.stats().bytes_sent.count(kind) ? comm.stats().bytes_sent.at(kind) : 0;
  if (got != want) {
    std::cerr << to_string(kind) << " bytes_sent " << got << ", expected " << want << "\n";
    ++g_failures;
  }
}

// Rank r's contribution: distinct per rank and element, uneven, exactly representable in bf16 sums.
at::Tensor rank_data(int rank, int64_t numel, at::ScalarType dtype) {
  auto i = torch::arange(numel, at::kDouble);
  return ((i.remainder(13) - 6) * (rank + 1) + rank * 3).to(dtype);
}

at::Tensor sum_over_ranks(int world, int64_t numel, at::ScalarType dtype) {
  at::Tensor sum = torch::zeros({numel}, at::kDouble);
  for (int r = 0; r < world; ++r) sum += rank_data(r, numel, at::kDouble);
  return sum.to(dtype);
}

void check_all_reduce(Communicator& comm) {
  const int n = comm.world_size(), r = comm.rank();
  at::Tensor t = rank_data(r, 1003, at::kFloat);
  comm.all_reduce(t, ReduceOp::kSum)->wait();
  expect_equal("all_reduce sum", t, sum_over_ranks(n, 1003, at::kFloat));
  t = rank_data(r, 1003, at::kFloat);
  comm.all_reduce(t, ReduceOp::kAvg)->wait();
  expect_equal("all_reduce avg", t, sum_over_ranks(n, 1003, at::kDouble).div(n).to(at::kFloat));
  t = rank_data(r, 1003, at::kFloat);
  comm.all_reduce(t, ReduceOp::kMax)->wait();
  at::Tensor max = rank_data(0, 1003, at::kFloat);
  for (int q = 1; q < n; ++q) max = at::maximum(max, rank_data(q, 1003, at::kFloat));
  expect_equal("all_reduce max", t, max);
}

void check_reduce_scatter(Communicator& comm, at::ScalarType dtype) {
  const int n = comm.world_size(), r = comm.rank();
  const int64_t chunk = 1001;
  comm.reset_stats();
  at::Tensor input = rank_data(r, n * chunk, dtype);
  at::Tensor output = torch::empty({chunk}, dtype);
  comm.reduce_scatter(output, input, ReduceOp::kSum)->wait();
  expect_equal("reduce_scatter", output,
               sum_over_ranks(n, n * chunk, dtype).narrow(0, r * chunk, chunk));
  expect_bytes(comm, CollectiveKind::kReduceScatter,
               uint64_t(n - 1) * chunk * input.element_size());
  // In place: the output is this rank's own chunk of the input.
  input = rank_data(r, n * chunk, dtype);
  at::Tensor own = input.narrow(0, r * chunk, chunk);
  comm.reduce_scatter(own, input, ReduceOp::kAvg)->wait();
  expect_equal(
      "reduce_scatter avg in place", own,
      sum_over_ranks(n, n * chunk, at::kDouble).div(n).to(dtype).narrow(0, r * chunk, chunk));
}

void check_all_gather(Communicator& comm, at::ScalarType dtype) {
  const int n = comm.world_size(), r = comm.rank();
  const int64_t chunk = 777;
  comm.reset_stats();
  at::Tensor input = rank_data(r, chunk, dtype);
  at::Tensor output = torch::full({n * chunk}, -1, dtype);
  comm.all_gather(output, input)->wait();
  for (int q = 0; q < n; ++q) {
    expect_equal("all_gather", output.narrow(0, q * chunk, chunk), rank_data(q, chunk, dtype));
  }
  expect_bytes(comm, CollectiveKind::kAllGather, uint64_t(n - 1) * chunk * input.element_size());
}

void check_broadcast_and_overlap(Communicator& comm) {
  const int n = comm.world_size(), r = comm.rank();
  at::Tensor t = rank_data(r, 555, at::kBFloat16);
  comm.broadcast(t, n - 1)->wait();
  expect_equal("broadcast bf16", t, rank_data(n - 1, 555, at::kBFloat16));
  // Two collectives in flight before either is waited on.
  at::Tensor rs_in = rank_data(r, n * 64, at::kFloat), rs_out = torch::empty({64});
  at::Tensor ag_in = rank_data(r, 64, at::kFloat), ag_out = torch::empty({n * 64});
  auto first = comm.reduce_scatter(rs_out, rs_in, ReduceOp::kSum);
  auto second = comm.all_gather(ag_out, ag_in);
  second->wait();
  first->wait();
  expect_equal("overlapped reduce_scatter", rs_out,
               sum_over_ranks(n, n * 64, at::kFloat).narrow(0, r * 64, 64));
  expect_equal("overlapped all_gather", ag_out.narrow(0, 0, 64), rank_data(0, 64, at::kFloat));
  comm.barrier();
}

void collectives(Communicator& comm) {
  check_all_reduce(comm);
  check_reduce_scatter(comm, at::kFloat);
  check_reduce_scatter(comm, at::kBFloat16);
  check_all_gather(comm, at::kFloat);
  check_all_gather(comm, at::kHalf);
  check_broadcast_and_overlap(comm);
  at::Tensor bf = rank_data(comm.rank(), 300, at::kBFloat16);
  comm.all_reduce(bf, ReduceOp::kSum)->wait();
  expect_equal("all_reduce bf16", bf, sum_over_ranks(comm.world_size(), 300, at::kBFloat16));
}

// all_to_all on the world, then split into groups of two consecutive ranks (and the odd one
// alone): all_reduce and all_to_all inside the groups while the world goes on beside them.
void groups(Communicator& comm) {
  const int n = comm.world_size(), r = comm.rank();
  const int64_t chunk = 37;
  comm.reset_stats();
  at::Tensor in = rank_data(r, n * chunk, at::kFloat), out = torch::empty({n * chunk});
  comm.all_to_all(out, in)->wait();
  for (int q = 0; q < n; ++q) {
    expect_equal("all_to_all", out.narrow(0, q * chunk, chunk),
                 rank_data(q, n * chunk, at::kFloat).narrow(0, r * chunk, chunk));
  }
  expect_bytes(comm, CollectiveKind::kAllToAll, uint64_t(n - 1) * chunk * 4);
  // Uneven splits of rows of 5: rank q sends (q + j) % 3 rows to rank j (some none), row i of
  // what it sends to j holding 100·q + 10·j + i; float32, then bfloat16.
  const auto rows = [](int q, int j) { return static_cast<int64_t>((q + j) % 3); };
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    comm.reset_stats();
    std::vector<int64_t> send, receive;
    std::vector<at::Tensor> mine, want;
    for (int j = 0; j < n; ++j) {
      send.push_back(rows(r, j));
      receive.push_back(rows(j, r));
      const auto block = [](int q, int to, int64_t count) {
        return (torch::arange(count, at::kDouble) + 100.0 * q + 10.0 * to)
            .unsqueeze(1)
            .expand({count, 5});
      };
      mine.push_back(block(r, j, rows(r, j)));
      want.push_back(block(j, r, rows(j, r)));
    }
    const at::Tensor vin = torch::cat(mine).to(dtype).contiguous();
    at::Tensor vout = torch::empty({torch::cat(want).size(0), 5}, dtype);
    comm.all_to_all_v(vout, vin, receive, send)->wait();
    expect_equal("all_to_all_v", vout, torch::cat(want).to(dtype));
    uint64_t crossing = 0;
    for (int j = 0; j < n; ++j) crossing += j == r ? 0 : static_cast<uint64_t>(rows(r, j));
    expect_bytes(comm, CollectiveKind::kAllToAll, crossing * 5 * at::elementSize(dtype));
  }
  auto group = comm.split(r / 2);
  const int size = std::min(2, n - (r / 2) * 2);
  if (group->world_size() != size || group->rank() != r % 2) {
    std::cerr << "split: rank " << group->rank() << " of " << group->world_size() << "\n";
    ++g_failures;
  }
  at::Tensor t = torch::full({5}, static_cast<float>(r));
  group->all_reduce(t, ReduceOp::kSum)->wait();
  const float want = size == 2 ? static_cast<float>(2 * (r / 2) * 2 + 1) : static_cast<float>(r);
  expect_equal("group all_reduce", t, torch::full({5}, want));
  at::Tensor world_sum = torch::ones({3});
  auto pending = comm.all_reduce(world_sum, ReduceOp::kSum);
  at::Tensor gin = rank_data(r, size * 4, at::kBFloat16),
             gout = torch::empty({size * 4}, at::kBFloat16);
  group->all_to_all(gout, gin)->wait();
  pending->wait();
  expect_equal("world all_reduce beside a group", world_sum,
               torch::full({3}, static_cast<float>(n)));
  for (int q = 0; q < size; ++q) {
    const int peer = (r / 2) * 2 + q;
    expect_equal("group all_to_all bf16", gout.narrow(0, q * 4, 4),
                 rank_data(peer, size * 4, at::kBFloat16).narrow(0, (r % 2) * 4, 4));
  }
  group->barrier();
  // Ten times a group of the first and the last rank only (a pipeline's tied embeddings): the
  // others pass kNoGroup and drop what they get at once, which must not break the pair's split.
  for (int i = 0; i < 10; ++i) {
    const bool end = r == 0 || r == n - 1;
    auto pair = comm.split(end ? 0 : kNoGroup);
    if (pair->world_size() != (end ? std::min(n, 2) : 1) || (end && pair->rank() != (r > 0))) {
      std::cerr << "pair: rank " << pair->rank() << " of " << pair->world_size() << "\n";
      ++g_failures;
    }
    if (!end) continue;
    at::Tensor u = torch::full({3}, static_cast<float>(r));
    pair->all_reduce(u, ReduceOp::kSum)->wait();
    expect_equal("pair all_reduce", u, torch::full({3}, static_cast<float>(n > 1 ? n - 1 : 0)));
  }
  comm.barrier();
}

// The last rank dies after the barrier; the others must get an error from their all_reduce.
void peer_dies(Communicator& comm) {
  comm.barrier();
  if (comm.rank() == comm.world_size() - 1) _exit(3);
  at::Tensor t = torch::ones({1 << 20});
  comm.all_reduce(t, ReduceOp::kSum)->wait();
}

// The last rank is slow, not dead: it reaches the all_reduce only after twice the timeout the
// others wait in it, its process alive all along. Their errors must not name it dead.
void peer_slow(Communicator& comm, std::chrono::milliseconds timeout) {
  comm.barrier();
  if (comm.rank() == comm.world_size() - 1) std::this_thread::sleep_for(2 * timeout);
  at::Tensor t = torch::ones({1 << 10});
  comm.all_reduce(t, ReduceOp::kSum)->wait();
}

// Rank 0 — the host of the rendezvous store — stops (SIGSTOP: its whole process, store included,
// as a frozen host would) after a barrier; the others then wait in an all_reduce. They must fail
// after the timeout and a bounded diagnosis, not block on the store that never answers.
void rank0_stops(Communicator& comm) {
  comm.barrier();
  if (comm.rank() == 0) ::raise(SIGSTOP);
  at::Tensor t = torch::ones({1 << 10});
  comm.all_reduce(t, ReduceOp::kSum)->wait();
}

// Point-to-point: a ring pass in one batch per rank, pairs that send to each other and receive
// from each other in one batch (bf16), three messages in a row received in the order sent with an
// all_reduce between them, a transfer inside a split group, and the byte counters. A world of one
// has no peer: a transfer is refused.
void point_to_point(Communicator& comm) {
  const int n = comm.world_size(), r = comm.rank();
  if (n == 1) {
    try {
      comm.send(torch::ones({4}), 0)->wait();
      std::cerr << "a send to itself was not refused\n";
      ++g_failures;
    } catch (const dstrain::Error&) {
    }
    return;
  }
  comm.reset_stats();
  const int next = (r + 1) % n, prev = (r - 1 + n) % n;
  at::Tensor got = torch::empty({1000});
  comm.exchange({{CollectiveKind::kSend, rank_data(r, 1000, at::kFloat), next},
                 {CollectiveKind::kRecv, got, prev}})
      ->wait();
  expect_equal("ring pass", got, rank_data(prev, 1000, at::kFloat));
  uint64_t sent = 1000 * 4;
  const int partner = r ^ 1;
  if (partner < n) {
    at::Tensor back = torch::empty({333}, at::kBFloat16);
    comm.exchange({{CollectiveKind::kSend, rank_data(r, 333, at::kBFloat16), partner},
                   {CollectiveKind::kRecv, back, partner}})
        ->wait();
    expect_equal("pair exchange bf16", back, rank_data(partner, 333, at::kBFloat16));
    sent += 333 * 2;
  }
  // Rank 0 sends three messages to rank 1 before it waits on any; an all_reduce in between.
  at::Tensor sum = torch::ones({8});
  if (r == 0) {
    std::vector<at::Tensor> messages;
    std::vector<std::unique_ptr<dstrain::comm::Work>> sends;
    for (int i = 0; i < 3; ++i) {
      messages.push_back(torch::full({64}, static_cast<float>(i + 1)));
      sends.push_back(comm.send(messages.back(), 1));
      sent += 64 * 4;
    }
    comm.all_reduce(sum, ReduceOp::kSum)->wait();
    for (auto& s : sends) s->wait();
  } else {
    comm.all_reduce(sum, ReduceOp::kSum)->wait();
    if (r == 1) {
      for (int i = 0; i < 3; ++i) {
        at::Tensor m = torch::empty({64});
        comm.recv(m, 0)->wait();
        expect_equal("messages in order", m, torch::full({64}, static_cast<float>(i + 1)));
      }
    }
  }
  expect_equal("all_reduce between transfers", sum, torch::full({8}, static_cast<float>(n)));
  expect_bytes(comm, CollectiveKind::kSend, sent);
  expect_bytes(comm, CollectiveKind::kRecv, 0);
  // In groups {0, 1}, {2, 3}: group rank 1 sends to group rank 0.
  auto group = comm.split(r / 2);
  if (group->world_size() == 2) {
    at::Tensor t = torch::empty({16});
    if (group->rank() == 1) {
      group->send(rank_data(r, 16, at::kFloat), 0)->wait();
    } else {
      group->recv(t, 1)->wait();
      expect_equal("group transfer", t, rank_data(r + 1, 16, at::kFloat));
    }
  }
  comm.barrier();
}

// The last rank dies after the barrier while rank 0 waits to receive from it through a group of
// the two of them (rank 0 and the last: the error names the world's rank); the others only wait.
void peer_dies_sending(Communicator& comm) {
  const int n = comm.world_size(), r = comm.rank();
  auto pair = comm.split(r == 0 || r == n - 1 ? 0 : 1);
  comm.barrier();
  if (r == n - 1) _exit(3);
  if (r == 0) {
    at::Tensor t = torch::empty({1 << 16});
    pair->recv(t, 1)->wait();
  }
}

// Rank 1 is alive but never sends; rank 0's receive times out, rank 1 ends after twice the
// timeout.
void peer_never_sends(Communicator& comm, std::chrono::milliseconds timeout) {
  comm.barrier();
  if (comm.rank() == 1) {
    std::this_thread::sleep_for(2 * timeout);
    return;
  }
  at::Tensor t = torch::empty({64});
  comm.recv(t, 1)->wait();
}

void write_result(const std::string& dir, int rank, const std::string& line) {
  std::ofstream(dir + "/rank" + std::to_string(rank) + ".txt") << line << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: comm_test_worker "
                 "<collectives|groups|rendezvous|peer_dies|peer_slow|rank0_stops|point_to_point|"
                 "peer_dies_sending|peer_never_sends> "
                 "<result-dir>\n";
    return 2;
  }
  const std::string scenario = argv[1], dir = argv[2];
  auto options = dstrain::comm::rendezvous_options_from_env();
  try {
    auto comm = dstrain::comm::make_gloo_communicator(options);
    if (scenario == "collectives") collectives(*comm);
    if (scenario == "groups") groups(*comm);
    if (scenario == "peer_dies") peer_dies(*comm);
    if (scenario == "peer_slow") peer_slow(*comm, options.timeout);
    if (scenario == "rank0_stops") rank0_stops(*comm);
    if (scenario == "point_to_point") point_to_point(*comm);
    if (scenario == "peer_dies_sending") peer_dies_sending(*comm);
    if (scenario == "peer_never_sends") peer_never_sends(*comm, options.timeout);
  } catch (const dstrain::Error& e) {
    write_result(dir, options.rank, std::string("ERROR [") + to_string(e.kind()) + "] " + e.what());
    return 0;
  } catch (const std::exception& e) {
    write_result(dir, options.rank, std::string("UNTRANSLATED ") + e.what());
    return 1;
  }
  write_result(dir, options.rank, g_failures == 0 ? "OK" : "MISMATCH");
  return g_failures == 0 ? 0 : 1;
}
