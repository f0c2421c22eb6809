#pragma once
// What the engine tests of parallelize() share: plain SGD, the masters a rank owns, a small LoRA.

#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "optim/optimizer.h"
#include "train/parallelize.h"
#include "zero/engine.h"

namespace dstrain::train::testing {

// Plain SGD: an update is -lr × the gradient the engine reduced, so comparing updates compares the
// gradients themselves (AdamW would hide a gradient counted twice: it is scale-invariant).
inline zero::OptimizerFactory sgd() {
  return [](int64_t n, std::vector<optim::Range> no_decay) {
    optim::SgdOptions o;
    o.no_decay = std::move(no_decay);
    return optim::make_sgd(n, o);
  };
}

// AdamW with the norms and biases excluded from weight decay, as the trainer builds it.
inline zero::OptimizerFactory adamw() {
  return [](int64_t n, std::vector<optim::Range> no_decay) {
    optim::AdamWOptions o;
    o.no_decay = std::move(no_decay);
    return optim::make_adamw(n, o);
  };
}

// The fp32 master of every piece the engine owns on `rank`, by "rank:param@begin".
inline std::map<std::string, torch::Tensor> masters(const zero::Engine& engine, int rank) {
  std::map<std::string, torch::Tensor> out;
  for (const zero::StatePiece& piece : engine.owned_state()) {
    const std::string key =
        std::to_string(rank) + ":" + piece.param + "@" + std::to_string(piece.elements.begin);
    out[key] = piece.tensors.at("master").to(torch::kFloat, false, /*copy=*/true);
  }
  return out;
}

// LoRA r = 4, alpha 8 on `targets`.
inline LoraPlan small_lora(std::vector<std::string> targets) {
  LoraPlan plan;
  plan.options.r = 4;
  plan.options.alpha = 8;
  plan.options.target_modules = std::move(targets);
  plan.key = "test";
  return plan;
}

}  // namespace dstrain::train::testing
