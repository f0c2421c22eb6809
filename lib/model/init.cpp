// Random initialisation, dtype helpers and the causal LM loss.
#include <algorithm>
#include <map>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/accumulate.h>

#include "core/error.h"
#include "core/text.h"
#include "model/model.h"

namespace dstrain::model {
namespace {}  // namespace

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

namespace {

// Values are drawn in blocks of kInitBlock elements, each from its own generator seeded by (seed,
// parameter name, block index): any range of a parameter can be produced without drawing the
// elements before it, and a full init is the concatenation of the blocks.
constexpr int64_t kInitBlock = int64_t{1} << 16;

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// normal(0, std) elements [begin, end) of the parameter's block stream.
// A block is always drawn whole (how normal_ maps the generator's output to values depends on the
// tensor's length), then the wanted part is cut out.
torch::Tensor normal_range(const std::string& name, int64_t numel, uint64_t seed, double std,
                           int64_t begin, int64_t end) {
  torch::Tensor out = torch::empty({end - begin}, torch::kFloat);
  const uint64_t base = splitmix64(seed ^ fnv1a(name));
  for (int64_t block = begin / kInitBlock; block * kInitBlock < end; ++block) {
    const int64_t b0 = block * kInitBlock;
    const int64_t lo = std::max(begin, b0), hi = std::min(end, b0 + kInitBlock);
    auto gen =
        at::make_generator<at::CPUGeneratorImpl>(splitmix64(base + static_cast<uint64_t>(block)));
    torch::Tensor values = torch::empty({std::min(kInitBlock, numel - b0)}, torch::kFloat);
    values.normal_(0.0, std, gen);
    out.narrow(0, lo - begin, hi - lo).copy_(values.narrow(0, lo - b0, hi - lo));
  }
  return out;
}

}  // namespace

torch::Tensor init_values(const ModelConfig& config, const std::string& name,
                          c10::IntArrayRef shape, uint64_t seed, int64_t begin, int64_t end) {
  const int64_t numel = c10::multiply_integers(shape);
  if (begin < 0 || end < begin || end > numel) {
    fail(ErrorKind::kInternal, "init_values: range [{}, {}) outside '{}' of {} elements", begin,
         end, name, numel);
  }
  if (ends_with(name, "norm.weight")) return torch::ones({end - begin}, torch::kFloat);
  if (ends_with(name, ".bias")) return torch::zeros({end - begin}, torch::kFloat);
  torch::Tensor values = normal_range(name, numel, seed, config.initializer_range, begin, end);
  // The pad row of the embedding is zero, as in HF.
  const auto& pad = config.pad_token_id;
  if (name == "model.embed_tokens.weight" && pad && *pad >= 0 && *pad < config.vocab_size) {
    const int64_t row_begin = *pad * config.hidden_size;
    const int64_t lo = std::max(begin, row_begin);
    const int64_t hi = std::min(end, row_begin + config.hidden_size);
    if (lo < hi) values.narrow(0, lo - begin, hi - lo).zero_();
  }
  return values;
}

ValueSource init_source(DecoderModelImpl& model, uint64_t seed) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& item : model.named_parameters()) shapes[item.key()] = item.value().sizes().vec();
  return [config = model.config(), seed, shapes = std::move(shapes)](const std::string& name,
                                                                     int64_t begin, int64_t end) {
    return init_values(config, name, shapes.at(name), seed, begin, end);
  };
}

void init_weights(DecoderModelImpl& model, uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    torch::Tensor& p = item.value();
    p.copy_(init_values(model.config(), item.key(), p.sizes(), seed, 0, p.numel()).view(p.sizes()));
  }
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
  return causal_lm_loss_sum(logits, labels).mean();
}

}  // namespace dstrain::model
