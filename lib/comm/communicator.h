#pragma once
// Collective communication between the ranks of one job, on flat contiguous buffers.
//
// Contract:
//  - Every collective is called by all ranks in the same order with matching sizes and dtypes.
//  - Calls return a Work handle at once; wait() blocks until done and throws Error(kComm/kTimeout)
//    naming the collective and, where known, the ranks that did not take part. A destroyed handle
//    that was never waited on is waited on in its destructor (errors are then logged, not thrown).
//  - Buffers must stay alive and unmodified until wait() returns.
//  - Byte counters count what this rank sends over the wire for each collective kind, computed from
//    the algorithm's theory (ring: all_reduce 2(N-1)/N·S, reduce_scatter/all_gather (N-1)/N·S,
//    all_to_all (N-1)/N·S, where S is the full buffer size), so tests can check ZeRO's
//    communication volume.
//  - Point-to-point transfers (exchange(), send(), recv()) move a tensor between two ranks, for
//    pipeline stages. They keep program order with the collectives on each rank but need not be
//    matched by the other ranks; between two ranks, transfers in one direction arrive in the
//    order sent.
//  - split() makes sub-communicators (a sequence-parallel group, a data-parallel group) over the
//    same transport; ranks and sizes of a sub-communicator are its own.
// Implementations: GlooCommunicator (CPU, LibTorch c10d + libgloo), NcclCommunicator (CUDA).

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

namespace dstrain::comm {

enum class ReduceOp { kSum, kAvg, kMax };

enum class CollectiveKind {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier,
  kAllToAll,
  kSend,  // point-to-point (exchange)
  kRecv
};
// all_to_all's contract on sizes and dtypes (every implementation checks it the same way):
// Error(kInternal) unless input and output have one dtype and one size divisible by `world_size`.
void check_all_to_all_shapes(const torch::Tensor& output, const torch::Tensor& input,
                             int world_size);
// all_to_all_v's: Error(kInternal) unless both are contiguous with one dtype and one row shape
// (every dimension after the first), each split list has `world_size` entries >= 0 and they add
// up to the tensors' rows.
void check_all_to_all_v_shapes(const torch::Tensor& output, const torch::Tensor& input,
                               const std::vector<int64_t>& output_splits,
                               const std::vector<int64_t>& input_splits, int world_size);
// Bytes all_to_all_v sends to the other ranks: the rows of `input_splits` but `rank`'s own.
uint64_t all_to_all_v_bytes(const torch::Tensor& input, const std::vector<int64_t>& input_splits,
                            int rank);
const char* to_string(CollectiveKind kind);

class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
};

// One side of a point-to-point transfer: this rank's tensor sent to `peer`, or received from it
// into `tensor` (the sent tensor's size and dtype, contiguous, on the communicator's device).
struct PeerTransfer {
  CollectiveKind kind = CollectiveKind::kSend;  // kSend or kRecv
  torch::Tensor tensor;
  int peer = 0;  // a rank of this communicator other than this one
};
// exchange()'s contract (every implementation checks it the same way): Error(kInternal) for an
// empty list, a kind other than kSend/kRecv, a peer out of range or this rank, a tensor undefined
// or not contiguous.
void check_peer_transfers(const std::vector<PeerTransfer>& transfers, int rank, int world_size);

// The color of split() for a rank that joins no group; Error(kInternal) unless `color` is one
// that split() takes: >= 0 or kNoGroup.
inline constexpr int kNoGroup = -1;
void check_split_color(int color);

// "send to rank 1", "recv from rank 0", "send to rank 1 and recv from rank 1", ...: a batch of
// transfers in errors; `world_rank` maps a rank of the communicator to the world's.
std::string describe_transfers(const std::vector<PeerTransfer>& transfers,
                               const std::function<int(int)>& world_rank);

// Bytes one rank sends in a ring pass over a buffer of `total_bytes` among `n` ranks: (n-1)/n of it
// (what CommStats counts; all_reduce is two passes).
inline uint64_t ring_pass_bytes(int n, uint64_t total_bytes) {
  return total_bytes / n * (n - 1);
}

struct CommStats {
  std::map<CollectiveKind, uint64_t> bytes_sent;
  std::map<CollectiveKind, uint64_t> calls;
  uint64_t total_bytes() const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // In place over the whole tensor (contiguous).
  virtual std::unique_ptr<Work> all_reduce(torch::Tensor& tensor, ReduceOp op) = 0;
  // input: contiguous, numel = world_size * output.numel(); rank r receives reduced chunk r.
  virtual std::unique_ptr<Work> reduce_scatter(torch::Tensor& output, const torch::Tensor& input,
                                               ReduceOp op) = 0;
  // output: contiguous, numel = world_size * input.numel(); chunk r is rank r's input.
  virtual std::unique_ptr<Work> all_gather(torch::Tensor& output, const torch::Tensor& input) = 0;
  virtual std::unique_ptr<Work> broadcast(torch::Tensor& tensor, int root) = 0;
  virtual void barrier() = 0;
  // Equal splits: input and output contiguous, same dtype, numel = world_size * chunk. Chunk j of
  // this rank's input becomes chunk rank() of rank j's output. Its own inverse (backward of
  // itself, see autograd.h).
  virtual std::unique_ptr<Work> all_to_all(torch::Tensor& output, const torch::Tensor& input) = 0;
  // Uneven splits along dimension 0 (a Mixture-of-Experts layer's tokens sent to the ranks holding
  // their experts): rows [Σ input_splits[0, j), + input_splits[j]) of this rank's input go to rank
  // j, and rank i's rows for this rank land at row Σ output_splits[0, i) of the output, so
  // output_splits[i] must equal rank i's input_splits[rank()] (the callers exchange their counts
  // first). Shapes as check_all_to_all_v_shapes. Its inverse is the same call with the splits
  // swapped (see autograd.h). Byte counter (under kAllToAll): the rows sent to other ranks.
  virtual std::unique_ptr<Work> all_to_all_v(torch::Tensor& output, const torch::Tensor& input,
                                             std::vector<int64_t> output_splits,
                                             std::vector<int64_t> input_splits) = 0;

  // Point-to-point: every transfer of the batch is issued at once and wait() returns when all are
  // done, so two ranks that each send to the other and receive from it in one batch do not wait
  // on each other (NCCL's grouped send/recv; PyTorch's batch_isend_irecv). Byte counters: a send
  // counts its tensor's bytes under kSend, a receive nothing (its calls under kRecv). A peer that
  // stops sending is Error(kTimeout) after the communicator's timeout (NCCL: in the host's wait,
  // synchronize()), a dead one Error(kComm); Gloo's errors name the transfer's peer as a rank of
  // the world and, as for collectives, the ranks at fault.
  virtual std::unique_ptr<Work> exchange(std::vector<PeerTransfer> transfers) = 0;
  std::unique_ptr<Work> send(const torch::Tensor& tensor, int peer);
  std::unique_ptr<Work> recv(torch::Tensor& tensor, int peer);

  // Collective over every rank of this communicator (all call it, in the same order relative to
  // their other collectives): the ranks that pass the same `color` (>= 0) form a new
  // communicator, ranked in the order of their ranks here. Its collectives involve only them and
  // keep program order with this communicator's on each rank. It must be destroyed before this
  // one. A rank that passes kNoGroup joins no group: it gets a communicator of itself alone. A
  // rank that has no use for its group passes kNoGroup rather than dropping the group at once: a
  // member that drops a new group may close it while a peer is still connecting to it (Gloo), and
  // that peer's split fails. Error(kComm/kTimeout) as for the rendezvous; Error(kInternal) for
  // another negative color.
  virtual std::unique_ptr<Communicator> split(int color) = 0;

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 protected:
  void count(CollectiveKind kind, uint64_t bytes) {
    stats_.bytes_sent[kind] += bytes;
    stats_.calls[kind] += 1;
  }
  CommStats stats_;
};

struct RendezvousOptions {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and DSTRAIN_COMM_TIMEOUT seconds); a missing or
// malformed variable is Error(kUsage) naming it. Defaults: a single-process world.
RendezvousOptions rendezvous_options_from_env();

}  // namespace dstrain::comm
