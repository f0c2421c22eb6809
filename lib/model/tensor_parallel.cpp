#include "model/tensor_parallel.h"

#include <utility>
#include <vector>

#include "core/error.h"

namespace dstrain::model {
void check_tensor_parallel(const ModelConfig& c, int64_t size, const std::string& model,
                           const std::string& key) {
  if (size <= 1) return;
  if (c.moe.experts > 0) {
    fail(ErrorKind::kConfig,
         "model {}: a Mixture-of-Experts model ({}) does not run with tensor parallelism yet; set "
         "{} to 1",
         model, c.model_type, key);
  }
  const std::vector<std::pair<const char*, int64_t>> counts = {
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"intermediate_size", c.intermediate_size},
      {"vocab_size", c.vocab_size}};
  for (const auto& [what, count] : counts) {
    if (count % size == 0) continue;
    fail(ErrorKind::kConfig,
         "model {}: {} ({}) is not divisible by {} ({}): each rank of a tensor-parallel group "
         "holds an equal slice of the attention heads, the key/value heads, the MLP width and the "
         "vocabulary",
         model, what, count, key, size);
  }
}

ModelConfig tensor_parallel_config(const ModelConfig& config, int64_t rank, int64_t size) {
  ModelConfig local = config;
  if (size <= 1) return local;
  local.num_attention_heads /= size;
  local.num_key_value_heads /= size;
  local.intermediate_size /= size;
  local.vocab_size /= size;
  if (config.pad_token_id) {
    const int64_t offset = *config.pad_token_id - rank * local.vocab_size;
    local.pad_token_id =
        offset >= 0 && offset < local.vocab_size ? std::optional<int64_t>(offset) : std::nullopt;
  }
  return local;
}

torch::Tensor enter_region(TensorParallel* tp, const torch::Tensor& x) {
  if (tp == nullptr) return x;
  return tp->sequence_parallel() ? tp->gather_rows(x) : tp->enter(x);
}

torch::Tensor leave_region(TensorParallel* tp, const torch::Tensor& y) {
  if (tp == nullptr) return y;
  if (!tp->sequence_parallel()) return tp->leave(y);
  return tp->reduce_scatter_rows(y.reshape({-1, y.size(-1)}));
}

}  // namespace dstrain::model
