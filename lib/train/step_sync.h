#pragma once
// Agreeing across ranks on a few numbers without stalling the device every step.
//
// DeferredSum::start() all-reduces (sum) a few doubles behind the work queued so far and returns at
// once; finish(), called a step later, returns the sums. On a CUDA device the sums are copied to
// page-locked host memory behind the collective and an event marks the copy, so finish() waits
// for the previous step's work only, not for the step queued since. On the CPU (Gloo) the
// collective runs in the background meanwhile. Either way finish() waits with the communicator's
// timeout (comm::synchronize): a rank that stopped taking part surfaces as an error naming it.
//
// The trainer's use: the SIGUSR1 stop vote of step k is resolved after step k + 1, so the only
// host reads of a step that is not a log, save or last step are none.

#include <memory>
#include <optional>
#include <vector>

#include <c10/core/Event.h>
#include <torch/types.h>

#include "comm/communicator.h"

namespace dstrain::train {

// Every rank's `local` (float64, on the CPU), gathered over `comm` through `device` (NCCL gathers
// device tensors): [world, ...local's shape], on the CPU, the same on every rank. A collective that
// waits for its result.
torch::Tensor gather_from_ranks(comm::Communicator& comm, const torch::Tensor& local,
                                const torch::Device& device);

class DeferredSum {
 public:
  DeferredSum(comm::Communicator& comm, torch::Device device) : comm_(comm), device_(device) {}

  // Collective. Precondition: !pending().
  void start(const std::vector<double>& values);
  bool pending() const { return work_ != nullptr; }
  // The sums over ranks of the values given to start(). Precondition: pending().
  std::vector<double> finish();

 private:
  comm::Communicator& comm_;
  torch::Device device_;
  std::unique_ptr<comm::Work> work_;
  torch::Tensor values_;  // on the device, reduced in place
  torch::Tensor host_;    // CUDA: the page-locked copy of the sums
  std::optional<c10::Event> copied_;
};

}  // namespace dstrain::train
