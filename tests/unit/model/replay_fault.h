#pragma once
// For the tests of the layer graphs' checks (model/layer_graphs.h): a recorder whose replays read
// a parameter that differs from what the eager run reads, as a recording holding a stale address
// would. Recording (which runs the body once, for real) is left alone; every replay runs with
// `parameter` shifted by `delta` and puts its exact values back after (through variable_data(),
// which leaves the parameter's version counter alone: autograd sees no in-place change).

#include <functional>
#include <memory>
#include <utility>

#include <torch/torch.h>

#include "model/layer_graphs.h"

namespace dstrain::model::testing {

class PerturbedReplays final : public Recorder {
 public:
  PerturbedReplays(torch::Tensor parameter, double delta)
      : parameter_(std::move(parameter)), delta_(delta) {}

  bool supports(const torch::Tensor&) const override { return true; }
  void warm_up(const std::function<void()>& body) override { body(); }
  std::unique_ptr<Recording> record(const std::function<void()>& body, int) override {
    body();
    return std::make_unique<Replay>(body, parameter_, delta_);
  }

 private:
  class Replay final : public Recording {
   public:
    Replay(std::function<void()> body, torch::Tensor parameter, double delta)
        : body_(std::move(body)), parameter_(std::move(parameter)), delta_(delta) {}
    void replay() override {
      torch::Tensor data = parameter_.variable_data(), kept;
      if (data.storage().nbytes() == 0) {  // ZeRO-3 between gathers: the replay does not read it
        body_();
        return;
      }
      {
        torch::NoGradGuard no_grad;
        kept = data.clone();
        data.add_(delta_);
      }
      body_();
      torch::NoGradGuard no_grad;
      data.copy_(kept);
    }

   private:
    std::function<void()> body_;
    torch::Tensor parameter_;
    double delta_;
  };

  torch::Tensor parameter_;
  double delta_;
};

}  // namespace dstrain::model::testing
