#pragma once
// Shared pieces of the engine tests: a reference AdamW over a flat shard, a tiny MLP with biases
// and a 1-D "norm" weight, a fixed problem (initial weights + per-step global batches), and runners
// for the engine at any world size / stage and for a plain single-process reference.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "optim/optimizer.h"
#include "tests/common/thread_communicator.h"
#include "zero/engine.h"

namespace dstrain::zero::testing {

using dstrain::testing::run_ranks;
using dstrain::testing::ThreadCommunicator;

// torch.optim.AdamW semantics over a flat fp32 shard; `no_decay` ranges take no weight decay.
class TestAdamW : public optim::Optimizer {
 public:
  TestAdamW(int64_t numel, double weight_decay, const std::vector<optim::Range>& no_decay);
  void begin_step(double lr) override;
  void update(torch::Tensor& params, const torch::Tensor& grads, int64_t offset,
              const torch::Tensor& compute_copy) override;
  int64_t step_count() const override { return steps_; }
  std::map<std::string, torch::Tensor> state() const override;
  void load_state(const std::map<std::string, torch::Tensor>& state, int64_t step_count) override;
  const torch::Tensor& decay_mask() const { return decay_; }

 private:
  torch::Tensor exp_avg_, exp_avg_sq_, decay_;
  double weight_decay_;
  double lr_ = 0;
  int64_t steps_ = 0;
};

OptimizerFactory adamw_factory(double weight_decay = 0.1);
// The production AdamW (lib/optim) with the same hyper-parameters as TestAdamW.
OptimizerFactory real_adamw_factory(double weight_decay = 0.1);

struct TinyMlpImpl : torch::nn::Module {
  TinyMlpImpl(int64_t in, int64_t hidden, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  // The same function computed in fp32 from parameters of any dtype (CPU LibTorch 1.13 has no
  // fp16 matmul); gradients flow back to the parameters in their own dtype.
  torch::Tensor forward_fp32(const torch::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::Tensor norm_weight;  // [hidden], named "norm_weight"
};
TORCH_MODULE(TinyMlp);

struct Problem {
  int64_t in = 8, hidden = 16, out = 5;  // 245 parameters: not divisible by 2, 3 or 4
  int64_t batch = 24;                    // global batch, divisible by world × accumulation
  int steps = 20;
  std::vector<torch::Tensor> init;  // initial parameter values, in named_parameters order
  torch::Tensor x, y;               // [steps, batch, in], [steps, batch, out]
};
Problem make_problem(int steps = 20, int64_t hidden = 16, uint64_t seed = 0);

// A model with the problem's initial weights, in `dtype`.
TinyMlp make_model(const Problem& problem, torch::ScalarType dtype = torch::kFloat32);
std::vector<NamedParameter> named_parameters(TinyMlp& model);

// How an engine run is driven: `world` thread ranks, `steps` optimizer steps of `accum`
// micro-steps.
struct RunConfig {
  int world = 1;
  EngineOptions options;
  int accum = 1;  // micro-steps per optimizer step (gradient accumulation)
  int steps = 20;
  double lr = 1e-2;
  OptimizerFactory optimizer = adamw_factory();
  bool set_step_lr = false;  // tell the engine the lr before backward (Engine::set_step_lr)
};

// What every engine run records.
struct EngineRecord {
  std::vector<double> losses;         // global mean loss per step
  std::vector<StepResult> steps;      // rank 0's step results
  std::vector<MemoryReport> memory;   // per rank, after the last step
  std::vector<comm::CommStats> comm;  // per rank, over the last step
};

// One rank's side of a run, built on the rank's thread: its engine, the loss of micro-step `micro`
// of step `step` on this rank's rows (the driver runs backward and the step), and what the rank
// adds to the record after its last step (called under a lock; may be empty).
// (The engine is declared last so that it goes before the model the lambdas hold.)
struct RankSide {
  std::function<torch::Tensor(int step, int micro)> loss;
  std::function<void(int rank, Engine& engine)> record;
  std::unique_ptr<Engine> engine;
};

// Runs config.world ranks through config.steps optimizer steps of config.accum micro-steps at
// config.lr, each rank's side from `make_side`, and fills `record`'s common fields.
void drive_ranks(const RunConfig& config, EngineRecord& record,
                 const std::function<RankSide(ThreadCommunicator&)>& make_side);

struct RunResult : EngineRecord {
  std::vector<torch::Tensor> params;  // rank 0's final parameters (fp32 copies)
};

RunResult run_engine(const Problem& problem, const RunConfig& config);
// Single process, full global batch per step, same optimizer and clipping rule.
RunResult run_reference(const Problem& problem, int steps, double clip, double lr = 1e-2);

// Mean of the rank's micro-batch rows: rank r, micro-step m of A, world N.
torch::Tensor micro_batch(const torch::Tensor& batch, int world, int rank, int accum, int micro);

}  // namespace dstrain::zero::testing
