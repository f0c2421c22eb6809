#pragma once
// The LM head's projection and the cross-entropy loss fused, so that the [tokens, vocab] logits
// are never held whole: tokens are taken in chunks of at most loss_chunk_tokens(V, chunk_bytes)
// rows, and only one chunk's float32 logits and log-probabilities exist at a time (about twice
// chunk_bytes; on a GPU, where one kernel computes the chunk's loss and gradient in place
// (model/fused_layer_ops.h), only its logits in the compute dtype: half of chunk_bytes in bf16).
// For Qwen2.5-0.5B's head (V = 151936) at 2048 tokens the unfused forward+backward
// peaks at 4.1-4.6 GiB of allocations (fp32 logits, their log-softmax, their gradient); the fused
// one at about 1 GiB, most of it the float32 weight gradient (docs/performance.md).
//
// Chunk size: every chunk adds its product into dW [V, C], one pass over V·C elements, so small
// chunks cost time where memory bandwidth is scarce. On 2 CPU cores (bf16, the head above) the
// fused pass took 1.00x the unfused time at 128 MiB, 0.89x at 256 MiB and 0.93x at 512 MiB on a
// quiet machine, 1.49x / 1.24x / 1.10x with other jobs competing. The default, 256 MiB, keeps the
// peak near a quarter of the unfused one. On a GPU it is 1 GiB: on an H100 (Qwen2.5-0.5B shape,
// 8192 tokens a step, bf16) 256 MiB chunks of 441 tokens cost ~10 ms of a 142 ms step in the 19
// read-modify-writes of the float32 dW alone, done then as 361 blocks of a bf16 GEMM plus an add.
//
// Why the gradients are computed in forward (as Liger-Kernel does) and not recomputed in
// backward: the chunk's softmax is at hand in forward, so dL/dh = (softmax - onehot) @ W and
// dL/dW = (softmax - onehot)^T @ h cost the same two matmuls as the unfused backward, whereas
// recomputing would add a third pass over the vocabulary (about a third more head FLOPs; the head
// is ~30% of Qwen2.5-0.5B's matmul work). What is kept between forward and backward is dh [N, C]
// and dW [V, C] in float32 — the size of the weight gradient backward allocates anyway (twice it
// for bf16 weights), at the same point of the step (the loss is the last thing forward computes
// and the first thing backward differentiates) — and neither W nor h: a ZeRO-3 engine may release
// the gathered head weight right after forward. When no gradient is wanted (eval, no-grad mode)
// only the loss is computed; a frozen weight (LoRA) gets no dW, a hidden state that needs no
// gradient no dh.
//
// The function returns the SUM of the per-token losses; the caller divides by the number of
// counted tokens (known from the labels alone). So no 1/N enters forward: the stored gradients
// are those of the sum, accumulated in float32, and backward scales them once by the incoming
// gradient (1/N times the engine's loss scale and 1/accumulation) before casting to the weight's
// dtype. That keeps fp16 chunk gradients in [-1, 1] (no underflow from 1/N before loss scaling)
// and rounds bf16/fp16 gradients once, as the unfused path does.

#include <cstdint>

#include <torch/torch.h>

namespace dstrain::model {

class TensorParallel;

// The weight's rows as one rank's slice of a vocabulary split over a tensor-parallel group
// (tensor_parallel.h): they are the ids [first, first + V) of the whole vocabulary, and the
// labels are ids of the whole vocabulary. tp null: the weight is the whole vocabulary.
struct VocabSlice {
  TensorParallel* tp = nullptr;
  int64_t first = 0;
};

// Default budget for one chunk's float32 logits: on the CPU, and on a GPU, where fewer and larger
// chunks matter more (the float32 weight gradient is read and written once per chunk; a Qwen2.5
// vocabulary makes that 1 GB a chunk) and memory is plentiful beside the model.
constexpr int64_t kDefaultLossChunkBytes = int64_t{256} << 20;
constexpr int64_t kCudaLossChunkBytes = int64_t{1} << 30;

// The default budget on `device`.
int64_t loss_chunk_bytes(const torch::Device& device);

// Tokens per chunk: as many rows of `vocab` float32 logits as fit in `chunk_bytes`, at least 1.
int64_t loss_chunk_tokens(int64_t vocab, int64_t chunk_bytes);

// Sum over tokens whose label is not `ignore_index` of cross_entropy(hidden @ weight^T, label),
// computed as logsumexp(logits) - logits[label] with logits in float32 (label smoothing 0).
// hidden [..., C] and weight [V, C] in one dtype on one device; labels [...] int64 with hidden's
// leading shape, already aligned (not shifted here). Returns a float32 scalar, differentiable with
// respect to hidden and weight (gradients in their dtypes, accumulated like any other: a tied
// embedding weight gets the sum of both uses). Every label ignored: 0, with zero gradients.
// Labels outside [0, V) other than ignore_index: the error torch's gather raises. Backward may run
// once (the stored gradients are handed over, not copied). chunk_bytes 0: loss_chunk_bytes of
// hidden's device.
//
// With a vocabulary slice every rank of its group calls this with the same hidden and labels: the
// chunks' maximum logit, the sums of exp and the label's logit are reduced over the group (two
// collectives a chunk, the same number on every rank), so each rank returns the whole
// vocabulary's loss, and its gradients are its slice's: dW of its rows, and its part of dL/dh
// (the tensor-parallel region's enter sums the parts). Computed in float32 from the logits as on
// the CPU, not with the fused GPU kernel (which needs the whole row).
torch::Tensor linear_cross_entropy_sum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                       const torch::Tensor& labels, int64_t ignore_index,
                                       int64_t chunk_bytes = 0, const VocabSlice& slice = {});

}  // namespace dstrain::model
