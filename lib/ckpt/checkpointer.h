#pragma once
// The checkpoint manager: saves and restores named Stateful components (stateful.h) in the layout
// of layout.h and the shard format of shards.h. It knows nothing of what the components are.
//
// Save protocol — `latest` moves only when every rank's files of that step are durable:
//   save(), on every rank at the same step boundary:
//     1. wait for this rank's previous save if it is still being written (else no wait)
//     2. rank 0: prepare_tag_dir() (layout.h)
//     3. barrier: the one collective of a save, so no rank writes before the directory is ready
//     4. async: snapshot every component into host memory the save owns (pinned for GPU
//        tensors); sync: host tensors are taken as they are (Snapshot::kView, no copy)
//     5. hand the snapshot to this rank's writer thread (async) or write it now (sync)
//   each rank's writer: the shard file (large sequential writes, fsync), then its done record
//     shard_rK.json with the shard's size and crc32 (atomic), or shard_rK.error with the reason
//   rank 0's writer then commits, without the training communicator: it polls the tag directory
//     (the checkpoint directory is shared by every node) until every rank's done record exists,
//     writes the run's small files and manifest.json, repoints `latest` and prunes old checkpoints.
//     An error record or commit_timeout_s abandons the commit: the tag stays incomplete (never
//     loaded, pruned later) and `latest` keeps naming the previous checkpoint.
// A crash at any instant therefore leaves `latest` naming a complete, verified checkpoint.
//
// Writers of one node take one of max_writers_per_node slots (a lock file per slot in the node's
// temporary directory, released by the kernel if the process dies) around the shard write, so a
// shared file system is not hit by every rank of a node at once.
//
// Restore: read the manifest once, then every registered component in registration order, each
// given its own state; a component the checkpoint lacks, or holds and this run does not, or a
// state version newer than the component's, is Error(kInput) naming the checkpoint.
//
// Thread safety: one thread calls every method; the writer runs on its own thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/manifest.h"
#include "ckpt/stateful.h"

namespace dstrain::ckpt {

struct CheckpointerOptions {
  std::string dir;  // the checkpoint directory (shared by every node)
  int rank = 0;
  int world_size = 1;
  int64_t keep_last = 0;          // complete checkpoints kept (0 = all)
  bool async = true;              // write on a background thread while training continues
  int max_writers_per_node = 0;   // ranks of a node writing at once (0 = all)
  std::string node_lock_dir;      // node-local directory for the writer slots ("" = TMPDIR or /tmp)
  std::string job_key;            // tells this job's slots from another's on the same node
  double commit_timeout_s = 600;  // rank 0: longest wait for the other ranks' done records
};

// How one save ended on this rank.
struct SaveResult {
  int64_t step = 0;
  std::string tag_dir;
  bool ok = false;
  bool committed = false;  // rank 0: the manifest and `latest` were written
  std::string error;       // when !ok
  int64_t bytes = 0;       // this rank's shard
  double snapshot_s = 0;   // the training loop's stall: waiting for the previous save + snapshot
  double write_s = 0;      // this rank's shard write (and on rank 0 the commit)
};

class Checkpointer {
 public:
  // `barrier`: a barrier over every rank (the training communicator's).
  Checkpointer(CheckpointerOptions options, std::function<void()> barrier);
  ~Checkpointer();  // waits for a save in flight
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // `component` must outlive the Checkpointer. Names are unique; the order is the restore order.
  void add(std::string name, Stateful* component);

  // Collective (see the protocol above). `header`: the manifest's description of the run (tag,
  // world size, files and components are filled in here); `small_files`: (name, bytes) rank 0
  // writes into the tag directory (config, tokenizer files). Both matter on rank 0 only.
  void save(int64_t step, Manifest header,
            std::vector<std::pair<std::string, std::string>> small_files);
  // Results of saves that finished since the last call (at most one per save), oldest first.
  std::vector<SaveResult> take_finished();
  // Blocks until the save in flight (if any) has finished; its result is then in take_finished().
  void wait();

  // Restores every registered component from the complete tag directory `tag_dir`; returns its
  // manifest.
  Manifest restore(const std::string& tag_dir);

 private:
  struct Job;
  SaveResult write(Job& job) const;
  void collect(bool block);

  CheckpointerOptions options_;
  std::function<void()> barrier_;
  std::vector<std::pair<std::string, Stateful*>> components_;
  std::future<SaveResult> in_flight_;
  std::vector<SaveResult> finished_;
};

}  // namespace dstrain::ckpt
