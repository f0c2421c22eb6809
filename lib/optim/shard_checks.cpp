#include "optim/shard_checks.h"

#include "core/error.h"

namespace dstrain::optim {
namespace {

void check_one(const char* optimizer, const char* name, const torch::Tensor& t, int64_t numel,
               torch::Device device, bool bf16_allowed) {
  const bool dtype_ok = t.defined() && (t.scalar_type() == torch::kFloat ||
                                        (bf16_allowed && t.scalar_type() == torch::kBFloat16));
  if (!dtype_ok || t.dim() != 1 || !t.is_contiguous() || t.numel() != numel ||
      t.device() != device) {
    fail(ErrorKind::kInternal, "{}: {} must be a contiguous 1-D {} tensor of {} elements on {}",
         optimizer, name, bf16_allowed ? "float32 or bfloat16" : "float32", numel, device.str());
  }
}

}  // namespace

void check_piece(const char* optimizer, const torch::Tensor& params, const torch::Tensor& grads,
                 int64_t offset, int64_t numel, torch::Device device) {
  const int64_t n = params.defined() ? params.numel() : 0;
  if (offset < 0 || offset + n > numel) {
    fail(ErrorKind::kInternal, "{}: piece [{}, {}) outside the shard of {} elements", optimizer,
         offset, offset + n, numel);
  }
  check_one(optimizer, "params", params, n, device, /*bf16_allowed=*/false);
  check_one(optimizer, "grads", grads, n, device, /*bf16_allowed=*/true);
}

void check_compute_copy(const char* optimizer, const torch::Tensor& params,
                        const torch::Tensor& compute_copy) {
  if (!compute_copy.defined()) return;
  if (compute_copy.scalar_type() != torch::kBFloat16 || compute_copy.dim() != 1 ||
      !compute_copy.is_contiguous() || compute_copy.numel() != params.numel() ||
      compute_copy.device() != params.device()) {
    fail(ErrorKind::kInternal,
         "{}: the compute copy must be a contiguous 1-D bfloat16 tensor of {} elements on {}",
         optimizer, params.numel(), params.device().str());
  }
}

void load_named_state(const char* optimizer, std::map<std::string, torch::Tensor>& into,
                      const std::map<std::string, torch::Tensor>& state, int64_t step_count) {
  if (step_count < 0)
    fail(ErrorKind::kInput, "{} state: step count {} is negative", optimizer, step_count);
  for (const auto& [name, tensor] : state) {
    if (into.count(name) == 0)
      fail(ErrorKind::kInput, "{} state: unexpected tensor '{}'", optimizer, name);
  }
  for (auto& [name, mine] : into) {
    auto it = state.find(name);
    if (it == state.end())
      fail(ErrorKind::kInput, "{} state: tensor '{}' is missing", optimizer, name);
    if (it->second.numel() != mine.numel()) {
      fail(ErrorKind::kInput, "{} state: '{}' has {} elements, the shard has {}", optimizer, name,
           it->second.numel(), mine.numel());
    }
  }
  for (auto& [name, mine] : into) mine.copy_(state.at(name).reshape({-1}));
}

}  // namespace dstrain::optim
