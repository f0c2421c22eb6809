#pragma once
// Keeping the global batch when the world shrinks (`--min-nodes`, over SSH and under Slurm): the
// global batch is micro × gradient accumulation × ranks, and a restart on fewer ranks changes the
// accumulation so the product stays the same. One rule for both launch modes, so a job shrinks the
// same way whichever launched it.

#include <set>
#include <string>
#include <vector>

#include "launcher/launch_local.h"

namespace dstrain::launcher {

// The overrides (gradient accumulation, and DeepSpeed's train_batch_size when the config sets it)
// that keep the global batch of a run on `world` ranks on `new_world` ranks. Nothing for --exec or
// an unchanged world. Error(kConfig) naming the numbers when no whole accumulation keeps it, unless
// `allow_change` (then the nearest, announced on stderr). Reads launch.config_path with
// launch.overrides.
std::vector<std::string> batch_overrides(const LocalLaunchOptions& launch, bool allow_change,
                                         int world, int new_world);

// Every rank count a job on nodes of `node_sizes` ranks can shrink to while at least `min_nodes`
// (>= 1) nodes remain, the full world excluded.
std::set<int> shrunk_worlds(const std::vector<int>& node_sizes, int min_nodes);

// With min_nodes > 0: Error(kUsage) when min_nodes is more than the nodes; Error(kConfig) at plan
// time when some world the job could shrink to cannot keep the global batch (not checked with
// `allow_change`) or is not a multiple of parallel.sequence_parallel_size. Nothing with --exec.
// `what` names the nodes in the message ("host(s)", "Slurm node(s)").
void check_elastic_batch(const LocalLaunchOptions& launch, bool allow_change, int min_nodes,
                         const std::vector<int>& node_sizes, const char* what);

}  // namespace dstrain::launcher
