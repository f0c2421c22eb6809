#pragma once
// Starts a world of comm_test_worker processes on this machine (posix_spawn, one per rank, each
// with RANK/WORLD_SIZE/MASTER_ADDR=127.0.0.1/MASTER_PORT=<free port>) and collects their results.

#include <string>
#include <vector>

namespace dstrain::comm::testing {

struct RankResult {
  int exit_code = -1;  // -1: killed at the deadline
  std::string result;  // contents of rank<r>.txt, empty if none
};

struct WorldSpec {
  std::string scenario;
  int world_size = 1;
  std::vector<int> ranks;      // which ranks to start; empty: all
  double comm_timeout_s = 20;  // DSTRAIN_COMM_TIMEOUT for the workers
  double deadline_s = 40;      // the test kills whatever still runs after this
};

// Results indexed by rank (ranks that were not started stay default).
std::vector<RankResult> run_world(const WorldSpec& spec);

}  // namespace dstrain::comm::testing
