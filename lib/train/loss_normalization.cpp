#include "train/loss_normalization.h"

#include "core/error.h"

namespace dstrain::train {

LossNormalization loss_normalization_from_word(const std::string& word) {
  if (word == "tokens") return LossNormalization::kTokens;
  if (word == "micro_steps") return LossNormalization::kMicroSteps;
  fail(ErrorKind::kConfig, "training.loss_normalization: expected tokens or micro_steps, got {}",
       word);
}

torch::Tensor micro_step_scale(LossNormalization how, const torch::Tensor& labelled,
                               int64_t micro_batches, int64_t chunks, int64_t data_parallel) {
  if (how == LossNormalization::kMicroSteps) {
    return torch::full({}, static_cast<double>(chunks), labelled.options().dtype(torch::kFloat));
  }
  const int64_t micro_steps = micro_batches * chunks;
  return (static_cast<double>(micro_steps * data_parallel) / labelled.clamp_min(1))
      .to(torch::kFloat);
}

torch::Tensor micro_step_loss(const model::LossSum& loss, LossNormalization how,
                              const torch::Tensor& scale, const model::MoeConfig& moe,
                              int64_t chunks) {
  const torch::Tensor lm = (how == LossNormalization::kTokens ? loss.sum : loss.mean()) * scale;
  if (!loss.router.defined()) return lm;
  return lm + model::router_losses(loss.router).weighted(moe) * static_cast<double>(chunks);
}

}  // namespace dstrain::train
