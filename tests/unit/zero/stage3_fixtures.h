#pragma once
// A layered test model for ZeRO-3 (embedding unit, block units, head unit, optionally tied to the
// embedding like the decoder models) and a runner that trains it with the engine at any stage and
// world size, driving the forward segments the way the trainer does.

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "tests/unit/zero/zero_fixtures.h"
#include "zero/engine.h"

namespace dstrain::zero::testing {

struct StackShape {
  int64_t vocab = 13, dim = 6, layers = 3, seq = 4;
  bool tied = true;
};

// ids [B, T] → embedding [V, C] → L × (h + tanh(h W_iᵀ + b_i) ⊙ g_i) → (h ⊙ norm) Headᵀ → logits.
// Head = the embedding when tied. Units: embed 0, block i → 1 + i, norm (+ head) L + 1.
struct TinyStackImpl : torch::nn::Module {
  explicit TinyStackImpl(const StackShape& shape);
  // `engine` may be null (plain autograd); otherwise each segment is bracketed by it.
  torch::Tensor forward(const torch::Tensor& ids, Engine* engine);
  std::vector<NamedParameter> units();  // named parameters with their unit
  std::vector<std::vector<int>> segments() const;
  StackShape shape;
  torch::Tensor embed, norm, head;     // [V, C], [C], [V, C] (untied only)
  std::vector<torch::Tensor> w, b, g;  // per block: [C, C], [C], [C]
};
TORCH_MODULE(TinyStack);

struct StackProblem {
  StackShape shape;
  int64_t batch = 24;  // divisible by world × accumulation
  int steps = 20;
  std::map<std::string, torch::Tensor> init;  // fp32 initial values by name
  torch::Tensor ids, labels;                  // [steps, batch, T] int64
};
StackProblem make_stack_problem(StackShape shape = {}, int steps = 20, uint64_t seed = 1);

TinyStack make_stack(const StackProblem& problem);

struct StackRun : RunConfig {
  const std::map<std::pair<std::string, std::string>, torch::Tensor>* resume = nullptr;
  int64_t resume_steps = 0;   // optimizer steps of the resumed state; data starts there too
  std::string frozen_suffix;  // parameters whose name ends with it are frozen (as a LoRA base)
};

struct StackResult : EngineRecord {
  // Every rank's owned_state() assembled: (kind, param) → flattened fp32, and coverage counts.
  std::map<std::pair<std::string, std::string>, torch::Tensor> state;
  std::map<std::pair<std::string, std::string>, int64_t> covered;
};

StackResult run_stack(const StackProblem& problem, const StackRun& run);

}  // namespace dstrain::zero::testing
