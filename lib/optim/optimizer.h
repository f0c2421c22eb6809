#pragma once
// Optimizers update one flat fp32 shard of master weights in place, given the matching flat fp32
// gradient shard. The ZeRO engine owns the shards; an optimizer never sees parameter structure,
// only ranges of the shard (e.g. those that take no weight decay: norms and biases).
//
// Shapes: params, grads, and every state tensor are 1-D of the same numel, contiguous, on the same
// device; all float32 except the gradients, which may also be bfloat16 (the compute dtype: the
// engine then hands them over without a float32 copy; their conversion is exact, so the update is
// the same). Not thread-safe; step() itself may use several threads.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace dstrain::optim {

// Half-open [begin, end) element range within a shard.
struct Range {
  int64_t begin = 0;
  int64_t end = 0;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of the whole shard with learning rate `lr`: begin_step(lr), then
  // update(params, grads, 0).
  void step(torch::Tensor& params, const torch::Tensor& grads, double lr) {
    begin_step(lr);
    update(params, grads, 0);
  }
  // The same update in pieces, so that a piece can be updated as soon as its gradient is ready:
  // begin_step(lr) once, which increments step_count() (AdamW bias correction uses the incremented
  // count, as torch.optim.AdamW does), then update() for pieces that cover the shard once, in any
  // order. `params` and `grads` are the shard's elements [offset, offset + numel) (e.g. views of
  // it). Each element's update depends on that element only, so any split gives bit for bit the
  // result of step().
  //
  // `compute_copy`: undefined, or a contiguous bfloat16 tensor of params' numel on their device
  // that receives the updated params rounded to nearest even (the compute-dtype copy of a master
  // shard), written by the update itself where it can (the CUDA AdamW kernel, which saves a pass
  // over the shard) and copied after it elsewhere.
  virtual void begin_step(double lr) = 0;
  virtual void update(torch::Tensor& params, const torch::Tensor& grads, int64_t offset,
                      const torch::Tensor& compute_copy) = 0;
  void update(torch::Tensor& params, const torch::Tensor& grads, int64_t offset) {
    update(params, grads, offset, torch::Tensor());
  }
  virtual int64_t step_count() const = 0;
  // Named state tensors shaped like the shard (e.g. "exp_avg", "exp_avg_sq") for checkpoints, plus
  // the step count. load_state() checks names and sizes and throws Error(kInput) on mismatch.
  virtual std::map<std::string, torch::Tensor> state() const = 0;
  virtual void load_state(const std::map<std::string, torch::Tensor>& state,
                          int64_t step_count) = 0;
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  std::vector<Range> no_decay;  // ranges of the shard that take no weight decay
};

struct SgdOptions {
  double momentum = 0.0;
  double weight_decay = 0.0;
  std::vector<Range> no_decay;
};

// `numel`, `device`: of the shard the optimizer will update (state is allocated there).
std::unique_ptr<Optimizer> make_adamw(int64_t numel, const AdamWOptions& options,
                                      torch::Device device = torch::kCPU);
std::unique_ptr<Optimizer> make_sgd(int64_t numel, const SgdOptions& options,
                                    torch::Device device = torch::kCPU);

}  // namespace dstrain::optim
