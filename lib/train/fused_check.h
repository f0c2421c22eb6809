#pragma once
// The fused paths' first-use check in a run (model/kernel_check.h): each rank checks them on its
// own device, the ranks agree, and every rank switches off the paths that failed on any rank, so
// that all take the same ops (ranks holding replicas of the same parameters must compute alike).

#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "comm/communicator.h"
#include "model/kernel_check.h"
#include "model/model_config.h"

namespace dstrain::train {

// What the ranks agreed for one path.
struct FusedPathVerdict {
  model::FusedPath path = model::FusedPath::kAddRmsNorm;
  bool on = true;
  std::vector<int> failed_ranks;
  double error = 0, bound = 0;  // the worst failing rank's (0 when none failed)
  std::string tensor;           // that rank's worst tensor
};

// Gathers every rank's checks (`mine`, one per path in FusedPath's order) over `comm`, on
// `device` (NCCL gathers device tensors), and returns one verdict per path, the same on every
// rank. A collective: every rank calls it.
std::vector<FusedPathVerdict> agree_fused_checks(comm::Communicator& comm,
                                                 const std::vector<model::FusedCheck>& mine,
                                                 const torch::Device& device);

// The warning for a path switched off ("" for one left on).
std::string describe_verdict(const FusedPathVerdict& v);

// Checks, agrees and switches off (model::set_fused_path_on) what failed anywhere; rank 0 logs
// one line for the check and a warning per path switched off. A collective. Returns the
// verdicts. `fault`: for tests (model::PlantedFault), this rank's only.
std::vector<FusedPathVerdict> check_fused_kernels(
    comm::Communicator& comm, const model::FusedCheckShapes& shapes,
    const std::optional<model::PlantedFault>& fault = {});

// A run's check before its first step, where a fused path can run at all (model::use_fused_kernels
// for `dtype` on `device`): the model's layer shapes, `rows` tokens per micro-batch of sequences of
// `seq_len`. A collective where it runs (the condition is the same on every rank).
void check_fused_kernels_for_run(comm::Communicator& comm, const model::ModelConfig& model,
                                 int64_t rows, int64_t seq_len, torch::ScalarType dtype,
                                 const torch::Device& device);

}  // namespace dstrain::train
