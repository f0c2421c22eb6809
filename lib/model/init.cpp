// Random initialisation, dtype helpers and the causal LM loss.
#include <ATen/CPUGeneratorImpl.h>

#include "core/error.h"
#include "model/model.h"

namespace dstrain::model {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

torch::ScalarType resolve_dtype(const std::string& name, const ModelConfig& config) {
  const std::string n = (name.empty() || name == "auto") ? config.torch_dtype : name;
  if (n.empty() || n == "float32" || n == "fp32") return torch::kFloat;
  if (n == "bfloat16" || n == "bf16") return torch::kBFloat16;
  if (n == "float16" || n == "fp16") return torch::kHalf;
  fail(ErrorKind::kInput,
       "model dtype '{}' is not supported; expected auto, float32, bfloat16 or float16", n);
}

std::string dtype_name(torch::ScalarType type) {
  if (type == torch::kFloat) return "float32";
  if (type == torch::kBFloat16) return "bfloat16";
  if (type == torch::kHalf) return "float16";
  fail(ErrorKind::kInput, "model dtype {} is not supported; expected float32, bfloat16 or float16",
       c10::toString(type));
}

void init_weights(DecoderModelImpl& model, uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const double std = model.config().initializer_range;
  for (auto& item : model.named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor& p = item.value();
    if (ends_with(name, "norm.weight")) {
      p.fill_(1.0);
    } else if (ends_with(name, ".bias")) {
      p.zero_();
    } else {
      torch::Tensor values = torch::empty(p.sizes(), torch::kFloat);
      values.normal_(0.0, std, gen);
      p.copy_(values);
    }
  }
  const auto pad = model.model->embed_tokens->options.padding_idx();
  if (pad) model.model->embed_tokens->weight[*pad].zero_();
}

DecoderModel build_model(const ModelConfig& config, torch::ScalarType dtype, uint64_t seed) {
  DecoderModel model(config);
  init_weights(*model, seed);
  model->to(dtype);
  return model;
}

LossSum causal_lm_loss_sum(const torch::Tensor& logits, const torch::Tensor& labels) {
  const int64_t V = logits.size(-1);
  const torch::Tensor flat_labels = labels.reshape({-1});
  const torch::Tensor sum =
      torch::nn::functional::cross_entropy(logits.reshape({-1, V}).to(torch::kFloat), flat_labels,
                                           torch::nn::functional::CrossEntropyFuncOptions()
                                               .ignore_index(kIgnoreIndex)
                                               .reduction(torch::kSum));
  return {sum, flat_labels.ne(kIgnoreIndex).sum()};
}

torch::Tensor causal_lm_loss(const torch::Tensor& logits, const torch::Tensor& labels) {
  const LossSum s = causal_lm_loss_sum(logits, labels);
  return s.sum / s.count.clamp_min(1).to(torch::kFloat);
}

}  // namespace dstrain::model
