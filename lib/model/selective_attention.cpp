// Attention kept through a checkpointed layer's recompute; the design is in selective_attention.h.
#include "model/selective_attention.h"

#include <array>
#include <mutex>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "core/error.h"
#include "core/log.h"

namespace dstrain::model {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Kernel = KeptAttention::Kernel;

thread_local AttentionKeep* active_keep = nullptr;

// [B, KV, T, D] → [B, H, T, D]: each key/value head repeated for the H/KV query heads it serves.
Tensor repeat_heads(const Tensor& x, int64_t heads) {
  const int64_t B = x.size(0), KV = x.size(1), T = x.size(2), D = x.size(3);
  if (KV == heads) return x;
  return x.unsqueeze(2).expand({B, KV, heads / KV, T, D}).reshape({B, heads, T, D});
}

// The CUDA kernel for q: flash where it takes q's dtype and head_dim, else memory-efficient.
Kernel cuda_kernel(const Tensor& q) {
  const bool half = q.scalar_type() == torch::kHalf || q.scalar_type() == torch::kBFloat16;
  const int64_t D = q.size(3);
  return half && D % 8 == 0 && D <= 256 ? Kernel::kCudaFlash : Kernel::kCudaEfficient;
}

// Output and statistics of causal attention (k, v with q's head count on CUDA).
KeptAttention attend(const Tensor& q, const Tensor& k, const Tensor& v) {
  KeptAttention kept;
  if (q.is_cpu()) {
    std::tie(kept.out, kept.lse) =
        at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, /*dropout_p=*/0.0, true);
    return kept;
  }
  kept.kernel = cuda_kernel(q);
  if (kept.kernel == Kernel::kCudaFlash) {
    auto r = at::_scaled_dot_product_flash_attention(q, k, v, /*dropout_p=*/0.0, true);
    kept.out = std::get<0>(r);
    kept.lse = std::get<1>(r);
    kept.cum_seq_q = std::get<2>(r);
    kept.cum_seq_k = std::get<3>(r);
    kept.max_q = std::get<4>(r).expect_int();
    kept.max_k = std::get<5>(r).expect_int();
    kept.philox_seed = std::get<6>(r);
    kept.philox_offset = std::get<7>(r);
    return kept;
  }
  auto r = at::_scaled_dot_product_efficient_attention(q, k, v, /*attn_bias=*/std::nullopt,
                                                       /*compute_log_sumexp=*/true, 0.0, true);
  kept.out = std::get<0>(r);
  kept.lse = std::get<1>(r);
  kept.philox_seed = std::get<2>(r);
  kept.philox_offset = std::get<3>(r);
  return kept;
}

// dq, dk, dv of the kept attention from dL/d out `g`; `s` holds q, k, v, out, lse and the CUDA
// bookkeeping in save order.
std::tuple<Tensor, Tensor, Tensor> attend_backward(const Tensor& g, const variable_list& s,
                                                   Kernel kernel, int64_t max_q, int64_t max_k) {
  const Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4];
  switch (kernel) {
    case Kernel::kCpuFlash:
      return at::_scaled_dot_product_flash_attention_for_cpu_backward(g, q, k, v, out, lse, 0.0,
                                                                      true);
    case Kernel::kCudaFlash:
      return at::_scaled_dot_product_flash_attention_backward(g, q, k, v, out, lse, s[5], s[6],
                                                              max_q, max_k, 0.0, true, s[7], s[8]);
    case Kernel::kCudaEfficient: {
      auto r = at::_scaled_dot_product_efficient_attention_backward(
          g, q, k, v, Tensor(), out, lse, s[7], s[8], 0.0,
          std::array<bool, 4>{true, true, true, false}, true);
      return {std::get<0>(r), std::get<1>(r), std::get<2>(r)};
    }
  }
  fail(ErrorKind::kInternal, "selective checkpointing: unknown attention kernel");
}

// The recompute's attention: the kept output as a function of q, k, v, without computing it.
struct KeptAttentionFunction : torch::autograd::Function<KeptAttentionFunction> {
  static Tensor forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        KeptAttention kept) {
    ctx->save_for_backward({q, k, v, kept.out, kept.lse, kept.cum_seq_q, kept.cum_seq_k,
                            kept.philox_seed, kept.philox_offset});
    ctx->saved_data["kernel"] = static_cast<int64_t>(kept.kernel);
    ctx->saved_data["max_q"] = kept.max_q;
    ctx->saved_data["max_k"] = kept.max_k;
    return kept.out;
  }

  // grads[0]: dL/d out [B, H, T, D]. Returns dq, dk, dv and nothing for the kept results.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto kernel = static_cast<Kernel>(ctx->saved_data["kernel"].toInt());
    auto [dq, dk, dv] =
        attend_backward(grads[0], ctx->get_saved_variables(), kernel,
                        ctx->saved_data["max_q"].toInt(), ctx->saved_data["max_k"].toInt());
    return {dq, dk, dv, Tensor()};
  }
};

// One warning per reason per process: every layer of every step would repeat it.
void warn_recomputed(std::once_flag& once, const char* why) {
  std::call_once(once, [why] {
    log::warn(
        "model.gradient_checkpointing: selective: {}: their attention is recomputed in backward "
        "as with `true`",
        why);
  });
}

}  // namespace

KeptAttention AttentionKeep::take() {
  if (entries_.empty()) {
    fail(ErrorKind::kInternal,
         "selective checkpointing: a layer's recompute found no attention kept by its forward "
         "(one backward per forward)");
  }
  KeptAttention kept = std::move(entries_.front());
  entries_.pop_front();
  return kept;
}

KeepAttentionScope::KeepAttentionScope(AttentionKeep& keep) : previous_(active_keep) {
  active_keep = &keep;
}

KeepAttentionScope::~KeepAttentionScope() {
  active_keep = previous_;
}

AttentionKeep* attention_keep(const torch::Tensor& q, std::optional<int64_t> window, bool packed) {
  if (active_keep == nullptr) return nullptr;
  static std::once_flag windowed, documents, device;
  if (packed) {
    warn_recomputed(documents, "rows of packed documents keep no softmax statistics per document");
    return nullptr;
  }
  if (window && q.size(2) > *window) {
    warn_recomputed(windowed,
                    "sliding-window layers over sequences longer than their window keep no "
                    "softmax statistics");
    return nullptr;
  }
  if (!q.is_cpu() && !q.is_cuda()) {
    warn_recomputed(device, "attention on this device has no kernel that returns its statistics");
    return nullptr;
  }
  return active_keep;
}

torch::Tensor keep_attention(AttentionKeep& keep, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v) {
  // CUDA: the kernels take one head count (GQA repeated here; autograd sums the repeats back).
  const Tensor key = q.is_cuda() ? repeat_heads(k, q.size(1)) : k;
  const Tensor value = q.is_cuda() ? repeat_heads(v, q.size(1)) : v;
  if (!torch::GradMode::is_enabled()) {
    KeptAttention kept = attend(q, key, value);
    Tensor out = kept.out;
    keep.push(std::move(kept));
    return out;
  }
  KeptAttention kept = keep.take();
  if (kept.out.sizes() != q.sizes()) {
    fail(ErrorKind::kInternal,
         "selective checkpointing: the recompute's attention has q {} but the forward kept an "
         "output {}",
         c10::str(q.sizes()), c10::str(kept.out.sizes()));
  }
  return KeptAttentionFunction::apply(q, key, value, std::move(kept));
}

}  // namespace dstrain::model
