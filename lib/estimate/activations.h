#pragma once
// Activation memory of one micro-batch's forward + backward on one rank, for each activation-
// checkpointing setting (model::Checkpointing), with or without tiled MLP: the other half of a
// run's memory beside the model states of model_states.h.
//
// Each block of the model says what it holds (model::Block::activation_memory: the decoder layer
// and the head derive it tensor by tensor in model/blocks.cpp); this walks the block list of one
// model built without memory and adds it up. The RoPE tables every layer reads (cos and sin for
// the rank's positions) are the model's, on top. The peak is the largest of the moments the step
// passes through: the end of each block's forward and each block's backward, each on top of what
// the blocks up to it keep:
//
//   peak = tables + max over blocks i of ( Σ_{j ≤ i} kept_j + max(forward_i, backward_i) )
//
// A pipeline stage (ActivationInput::chunks) runs only its chunks' blocks, and its schedule holds
// several micro-batches' chunks between their forward and their backward (in_flight: 1F1B
// min(m, P − p), GPipe all m, interleaved more): the other in-flight chunks each keep what the
// largest chunk keeps through its step, beside the moments of the one running,
//
//   peak = tables + (in_flight − 1) · max_c Σ_{j ∈ c} kept_j + max_c (the moments of chunk c)
//
// What a stage sent on is not held (train/pipeline.h frees it once sent), and under GPipe the last
// stage's head keeps every micro-batch's fused-loss buffers (its kept) until its backward.
//
// Checkpointing wraps the layer blocks only (model::checkpoint_layers); the others are asked for
// Checkpointing::kNone. Each checkpointed call also keeps the random generators' states
// (model/rng_state.h: on the CPU 5,056 bytes a layer; host tensors on a GPU). Offloaded on a GPU,
// the store (model/activation_offload.h) holds on the device the input of the layer being
// recomputed and of the next one, fetched ahead: the two largest host parts, on top of every
// moment.
//
// For the Qwen2.5-0.5B shape in bf16 on a GPU a layer keeps 40.5 KB per token without
// checkpointing (model/blocks.cpp has the derivation).
//
// What a setting keeps through the step, per rank (N = micro_batch · seq_len / sp tokens):
//   none       every layer's saved tensors: L · layer_saved
//   selective  one input per layer and its attention's output and log-sum-exp,
//              L · N·(cC + c·HD + 4·heads), plus one layer's other saved tensors while it is
//              recomputed (model/selective_attention.h; on a GPU its k and v repeated to the
//              query heads, c·2·(HD − KVD) more)
//   plain      one input per layer, L · c·N·C, plus one layer's saved tensors while it is
//              recomputed
//   offload    on a GPU the inputs wait in pinned host memory (host = L · c·N·C) and the device
//              holds those of the layer being recomputed and of the next one; on the CPU the host
//              is the device, so offload is plain.
//
// CUDA graphs per layer (training.cuda_graphs: on, model/layer_graphs.h), where they can run (no
// sequence parallelism, no tiled MLP; checkpointing none or plain) keep on top, per rank: for each
// layer its recordings' static buffers, input, output and output gradient and the input's
// gradient, 4·c·N·C (with plain checkpointing also the grad-free forward's input and output,
// 2·c·N·C more), and a gradient buffer for each of its trainable parameters in c (none counted
// under LoRA: the adapters' are as small as the adapters); at ZeRO stage 3 every parameter kept
// gathered in c (zero::EngineOptions::keep_gathered_memory). The saved activations and the
// backward's working memory move into the graphs' pool without growing.
//
// Tensor parallelism (model/tensor_parallel.h): the blocks describe one rank's slice, and the
// buffers dstrain's own collectives allocate around the region (the row-parallel partial sums and
// their all-reduced copies, the gathered rows, a reduce-scatter's receive buffers, in forward and
// in backward) have no terms of their own: the predicted peaks stay 1–6% above those measured,
// these buffers included, with the CPU allocator over real Gloo (tests/unit/train/
// tensor_parallel_test.cpp); the communication libraries' internal buffers are not counted.
//
// Not modelled: LoRA's adapters (a LoRA run is estimated as full fine-tuning of its layers, an
// upper bound, without the head's dL/dW), sliding-window attention's masks, allocator fragmentation
// and caching, cuBLAS/cuDNN workspaces, communication buffers. The CPU path is checked against the
// CPU allocator's measured peak (tests/unit/estimate/activations_test.cpp).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/checkpointing.h"
#include "model/model.h"

namespace dstrain::estimate {

using model::Checkpointing;

// What one micro-batch's activations depend on.
struct ActivationInput {
  // The model's block list, built without memory (model::Materialize::kNo), once per plan.
  model::DecoderModel model{nullptr};
  int64_t micro_batch = 1;
  int64_t seq_len = 0;    // tokens per sequence (data.max_length)
  int64_t sp_size = 1;    // sequence-parallel degree: a rank holds seq_len / sp_size of each
  int element_bytes = 4;  // the activations' dtype: 2 (bf16/fp16) or 4 (fp32)
  bool cuda = false;      // a GPU: offload moves the layer inputs off the device
  bool fused_kernels =
      false;  // the fused RMSNorm/RoPE/SwiGLU/loss kernels run (model/fused_layer_ops.h)
  int64_t tiled_mlp = 0;         // model::kTiledMlpOff, kTiledMlpAuto or tokens per tile
  bool fused_loss = true;        // model.fused_loss
  int64_t loss_chunk_bytes = 0;  // the fused loss's chunk budget; 0: the device's default
  bool head_trains = true;       // the head's weight gets a gradient (not under LoRA)
  bool graphs = false;           // CUDA graphs per layer are recorded where the setting allows
  int zero_stage = 0;            // stage 3 keeps every parameter gathered under graphs
  // Pipeline parallelism: the blocks of the rank's chunks (its virtual stages, [first, end)), and
  // how many chunks' activations its schedule holds at its fullest (train/pipeline.h's
  // in_flight_chunks). Empty: every block, one micro-batch.
  std::vector<std::pair<size_t, size_t>> chunks;
  int64_t in_flight = 1;
};

// The parts of the first layer block and of the head, bytes on one rank (what `dstrain estimate`
// prints and its tests check).
struct ActivationParts {
  int64_t tokens = 0;       // N = micro_batch · seq_len / sp_size
  int64_t layer_saved = 0;  // one layer's tensors kept for backward without checkpointing
  int64_t layer_input = 0;  // one layer's input, c·N·C: what checkpointing keeps per layer
  // Attention's output and float32 log-sum-exp, N·(c·HD + 4·heads): what selective checkpointing
  // keeps per layer beside the input.
  int64_t layer_attention = 0;
  int64_t layer_backward = 0;  // working memory of one layer's backward beyond its saved tensors
  int64_t head_saved = 0;      // the head's tensors kept from forward to backward
  int64_t loss_transient = 0;  // the loss's working memory in forward (one chunk, when fused)
  int64_t head_backward = 0;   // the head's working memory at the start of backward
  int64_t context = 0;         // the RoPE tables every layer reads
};

// One setting's prediction.
struct ActivationRow {
  Checkpointing setting = Checkpointing::kNone;
  int64_t device = 0;         // peak bytes of activations on the device (graphs included)
  int64_t host = 0;           // offloaded layer inputs in (pinned) host memory
  int64_t graphs = 0;         // of device: what CUDA graphs keep (0 where they do not run)
  int64_t graph_buffers = 0;  // of graphs: their buffers and gradient buffers (not stage 3's)
  // What the graphs' memory pools hold (0 without graphs): their buffers and gradient buffers, the
  // saved activations that live there (every layer's without checkpointing, one layer's with)
  // and one layer's backward working memory. The budget their recordings keep to.
  int64_t graph_pools = 0;
};

ActivationParts activation_parts(const ActivationInput& in);
ActivationRow activation_row(const ActivationInput& in, Checkpointing setting);
// Fastest first (model::kCheckpointingSettings): none, selective, plain, offload.
std::vector<ActivationRow> activation_rows(const ActivationInput& in);

// model.gradient_checkpointing: auto, the fastest setting that fits: the first of `rows` (none,
// selective, plain, offload) whose predicted peak (model states + activations) fits `limit`.
// Nothing fitting, the setting with the smallest peak (offload on a GPU, plain on the CPU) with
// fits = false: the prediction is an estimate, so the run is tried rather than refused.
struct CheckpointingChoice {
  Checkpointing setting = Checkpointing::kNone;
  bool fits = true;
  std::vector<Checkpointing> settings;  // the rows' settings, in their order
  std::vector<int64_t> peaks;           // device bytes per setting, states included
  int64_t limit = 0;
};

// `rows`: activation_rows(); `model_states`: the engine's device bytes (EstimateRow::device()).
CheckpointingChoice choose_checkpointing(const std::vector<ActivationRow>& rows,
                                         int64_t model_states, int64_t limit);

// One line for the log: the choice, each setting's predicted peak and the limit.
std::string describe_choice(const CheckpointingChoice& choice);

// The activation part of `dstrain estimate`: a header naming the micro-batch, the sequence, the
// dtype and the path (GPU with fused kernels / CPU), then one line per setting.
std::string format_activations(const ActivationInput& in);

// The same for `dstrain estimate --json`: {tokens, layer_saved, layer_input, layer_attention,
// head_saved, rows:
// [{gradient_checkpointing, device, host}]}, bytes per rank.
nlohmann::json activations_json(const ActivationInput& in);

}  // namespace dstrain::estimate
