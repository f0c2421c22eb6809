#pragma once
// For the tests of the layer graphs' checks (model/layer_graphs.h): recorders whose replays
// compute what the eager run computes, but not as the graphs promise.
// - PerturbedReplays: its replays read a parameter that differs from what the eager run reads, as
//   a recording holding a stale address would. Recording (which runs the body once, for real) is
//   left alone; every replay runs with `parameter` shifted by `delta` and puts its exact values
//   back after (through variable_data(), which leaves the parameter's version counter alone:
//   autograd sees no in-place change).
// - TimedReplays: each replay recomputes (as replaying_recorder()'s); its time() gives every
//   timing with a replay in it `replay_seconds` and every other (an eager run) `eager_seconds`,
//   as a card on which replays are that much faster or slower would.

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

class TimedReplays final : public Recorder {
 public:
  TimedReplays(double eager_seconds, double replay_seconds)
      : clock_(std::make_shared<Clock>(Clock{eager_seconds, replay_seconds})) {}

  bool supports(const torch::Tensor&) const override { return true; }
  void warm_up(const std::function<void()>& body) override { body(); }
  std::unique_ptr<Recording> record(const std::function<void()>& body, int) override {
    body();
    return std::make_unique<Replay>(body, clock_);
  }
  double time(const std::function<void()>& fn) override {
    clock_->replayed = false;
    fn();
    return clock_->replayed ? clock_->replay_seconds : clock_->eager_seconds;
  }

 private:
  struct Clock {
    double eager_seconds, replay_seconds;
    bool replayed = false;
  };
  class Replay final : public Recording {
   public:
    Replay(std::function<void()> body, std::shared_ptr<Clock> clock)
        : body_(std::move(body)), clock_(std::move(clock)) {}
    void replay() override {
      body_();
      clock_->replayed = true;
    }

   private:
    std::function<void()> body_;
    std::shared_ptr<Clock> clock_;
  };

  std::shared_ptr<Clock> clock_;
};

}  // namespace dstrain::model::testing
