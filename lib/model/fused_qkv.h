#pragma once
// The q, k and v projections of a decoder layer's attention as one matrix product: x·[Wq;Wk;Wv]ᵀ
// (+ [bq;bk;bv] in the same addmm) instead of three, and in backward one product for dx and one for
// the three weights' gradients. On a GPU that is two fewer GEMM launches per layer forward and four
// fewer in backward, and larger products that fill the device better.
//
// The parameters stay what they are: q_proj/k_proj/v_proj weights (and biases) are separate
// tensors with their Hugging Face names, so ZeRO's flat layouts, checkpoints, LoRA and export do
// not change. The fused weight is a view when the three weights lie back to back in one storage:
// the ZeRO engines lay a block's parameters out in the order of its weights(), which for a decoder
// layer lists q, k and v's weights first and then their biases, at every stage and for LoRA's
// frozen base too. Otherwise (a model outside an engine) it is concatenated for the product and
// dropped at once: backward concatenates again rather than keep a copy per layer.
// Gradients come back as views of the fused products, one per parameter, through autograd's own
// accumulation: each parameter's .grad and its post-accumulate hooks see one gradient per backward.
//
// Not bit for bit the three products: dx is one reduction over H·D + 2·KV·D terms where the
// separate path adds three products' results. The CPU eager path, op for op what transformers
// runs, therefore keeps three products; the fused one runs where use_fused_kernels(x) holds.

#include <array>
#include <vector>

#include <torch/types.h>

namespace dstrain::model {

class LinearImpl;

// q, k, v: [..., out_q], [..., out_k], [..., out_v] for x [..., C]; views of one [..., out_q +
// out_k + out_v] product (last dimension contiguous, rows strided). Biases all defined or all not.
struct QkvOutputs {
  torch::Tensor q, k, v;
};
QkvOutputs fused_qkv(const torch::Tensor& x, const LinearImpl& q_proj, const LinearImpl& k_proj,
                     const LinearImpl& v_proj);
// The same from the tensors: weights {Wq, Wk, Wv}, biases {bq, bk, bv} or three undefined.
QkvOutputs fused_qkv(const torch::Tensor& x, const std::array<torch::Tensor, 3>& weights,
                     const std::array<torch::Tensor, 3>& biases);

// True when `parts` (same dtype and device, contiguous, equal trailing sizes) lie back to back in
// one storage in this order, so that their concatenation along dimension 0 is a view.
bool adjacent_rows(const std::vector<torch::Tensor>& parts);

// Whether a decoder layer fuses its q/k/v projections for input x: where use_fused_kernels(x)
// and fused_path_on(FusedPath::kQkv) hold, or anywhere while a FusedQkvEverywhere lives.
bool use_fused_qkv(const torch::Tensor& x);

// For tests: while one lives, use_fused_qkv is true on every device (process-wide), so that the
// CPU suite runs the path a GPU takes. Create it before the forward it should affect.
class FusedQkvEverywhere {
 public:
  FusedQkvEverywhere();
  ~FusedQkvEverywhere();
  FusedQkvEverywhere(const FusedQkvEverywhere&) = delete;
  FusedQkvEverywhere& operator=(const FusedQkvEverywhere&) = delete;
};

}  // namespace dstrain::model
