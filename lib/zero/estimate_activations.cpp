// Activation memory per checkpointing setting; the derivation is in estimate_activations.h.
#include "zero/estimate_activations.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/bytes.h"
#include "core/error.h"
#include "model/fused_linear_cross_entropy.h"
#include "model/tiled_mlp.h"

namespace dstrain::zero {
namespace {

// Per-token sizes of one layer, in elements unless named bytes.
struct Shape {
  int64_t C, I, HD, KVD, heads, V;
};

Shape shape_of(const model::ModelConfig& m) {
  return {m.hidden_size,
          m.intermediate_size,
          m.num_attention_heads * m.head_dim,
          m.num_key_value_heads * m.head_dim,
          m.num_attention_heads,
          m.vocab_size};
}

// Bytes per token one RMSNorm keeps, its output included (the next projections' input).
int64_t norm_saved(const Shape& s, int64_t c, bool fused) {
  // Eager: x.to(float32) (x itself when x is float32), the normalised value cast back, the output.
  const int64_t input = fused ? c * s.C : 4 * s.C;
  const int64_t normalised = fused ? 0 : c * s.C;
  return input + normalised + c * s.C + 4;  // + the float32 rstd
}

// Bytes per token the attention keeps: q and k after RoPE, v, SDPA's output and log-sum-exp.
int64_t attention_saved(const Shape& s, int64_t c) {
  return c * (2 * s.HD + 2 * s.KVD) + 4 * s.heads;
}

// Bytes per token the untiled SwiGLU MLP keeps: gate, up, the product (and silu(gate) when eager).
int64_t mlp_saved(const Shape& s, int64_t c, bool fused) {
  return (fused ? 3 : 4) * c * s.I;
}

// Tokens per MLP tile on this rank (0: untiled).
int64_t tile_tokens(const ActivationInput& in, int64_t tokens) {
  return model::mlp_tile_tokens(in.tiled_mlp, tokens, in.model.hidden_size);
}

// Working memory of one layer's backward on top of its saved tensors (bytes). MLP: the gradient
// of the layer's output, then of the product and of gate and up (or of silu(gate) and up), while
// the product itself is released (down_proj's backward is done with it); attention: the gradients
// of its output, q, k and v (a GPU's flash backward also accumulates dq in float32). Tiled: d x
// for every token, one tile's recomputed intermediates and their gradients, and the MLP weights'
// float32 gradient sums.
int64_t layer_backward(const ActivationInput& in, const Shape& s, int64_t N, int64_t c) {
  const bool fused = in.fused_kernels;
  const int64_t attention = N * (c * s.C + c * (2 * s.HD + 2 * s.KVD) + (in.cuda ? 4 * s.HD : 0));
  const int64_t tile = tile_tokens(in, N);
  if (tile == 0) return std::max(attention, N * (c * s.C + 2 * c * s.I));
  const int64_t per_tile = tile * (mlp_saved(s, c, fused) + (fused ? 3 : 4) * c * s.I);
  const int64_t weight_grads = 4 * 3 * s.C * s.I;
  return std::max(attention, N * c * s.C + per_tile + weight_grads);
}

// The loss's working memory in forward, beyond what the head keeps (bytes). Fused, per chunk of
// n tokens: a GPU's kernel turns its logits [n, V] (c) into their gradient in place; elsewhere
// two float32 [n, V] tensors live at once (the logits and their log-softmax), and later, with
// only the gradient in c left, its products with the weight [n, C] and, in reduced precision, the
// dW blocks. Unfused: the logits (and their float32 copy in reduced precision) beside the kept
// log-softmax.
int64_t loss_transient(const ActivationInput& in, const Shape& s, int64_t N, int64_t c) {
  if (!in.fused_loss) return N * s.V * (c + (c == 4 ? 0 : 4));
  const int64_t budget = in.loss_chunk_bytes > 0 ? in.loss_chunk_bytes
                                                 : (in.cuda ? model::kCudaLossChunkBytes
                                                            : model::kDefaultLossChunkBytes);
  const int64_t n = std::min(N, model::loss_chunk_tokens(s.V, budget));
  if (in.fused_kernels) return n * s.V * c + n * s.C * c + 4 * n;
  // The CPU adds reduced-precision dW products in blocks of 8192 vocabulary rows.
  const int64_t blocks = c == 4 ? 0 : std::min<int64_t>(8192, s.V) * s.C * c;
  return std::max(8 * n * s.V, n * s.V * c + n * s.C * c + blocks);
}

ActivationParts compute_parts(const ActivationInput& in) {
  const Shape s = shape_of(in.model);
  const int64_t c = in.element_bytes;
  const int64_t N = in.micro_batch * in.seq_len / std::max<int64_t>(1, in.sp_size);
  const bool fused = in.fused_kernels;
  ActivationParts p;
  p.tokens = N;
  const int64_t mlp = tile_tokens(in, N) > 0 ? 0 : mlp_saved(s, c, fused);
  p.layer_saved = N * (2 * norm_saved(s, c, fused) + attention_saved(s, c) + mlp);
  p.layer_input = N * c * s.C;
  p.layer_attention = N * (c * s.HD + 4 * s.heads);
  p.layer_backward = layer_backward(in, s, N, c);
  // The final norm's output is not kept: the fused loss keeps neither its input nor the weight.
  p.head_saved = N * (norm_saved(s, c, fused) - (in.fused_loss ? c * s.C : 0));
  if (in.fused_loss) {
    // dL/dh and dL/dW, computed in forward in float32 and held until backward.
    p.head_saved += 4 * N * s.C + (in.head_trains ? 4 * s.V * s.C : 0);
    // Backward casts them to the activations' and weight's dtype.
    p.head_backward = c == 4 ? 0 : c * N * s.C + (in.head_trains ? c * s.V * s.C : 0);
  } else {
    p.head_saved += 4 * N * s.V;    // the float32 log-softmax
    p.head_backward = 8 * N * s.V;  // the gradients of the loss and of the float32 logits
  }
  // The final norm's output, not kept but alive while the loss runs over it.
  p.loss_transient = loss_transient(in, s, N, c) + (in.fused_loss ? c * N * s.C : 0);
  // cos and sin [T, D] of the rank's positions.
  p.context = 2 * (in.seq_len / std::max<int64_t>(1, in.sp_size)) * in.model.head_dim * c;
  return p;
}

// A setting as the auto choice's log line names it.
const char* setting_name(Checkpointing setting) {
  switch (setting) {
    case Checkpointing::kNone:
      return "none";
    case Checkpointing::kSelective:
      return "selective";
    case Checkpointing::kPlain:
      return "plain";
    case Checkpointing::kOffload:
      return "offload";
  }
  return "?";
}

}  // namespace

std::string checkpointing_word(Checkpointing setting) {
  switch (setting) {
    case Checkpointing::kNone:
      return "false";
    case Checkpointing::kPlain:
      return "true";
    case Checkpointing::kOffload:
      return "offload";
    case Checkpointing::kSelective:
      return "selective";
  }
  return "?";
}

ActivationParts activation_parts(const ActivationInput& in) {
  if (in.micro_batch < 1 || in.seq_len < 1 || in.element_bytes < 1) {
    fail(ErrorKind::kInternal, "activation estimate: micro-batch {}, sequence {}, {}-byte dtype",
         in.micro_batch, in.seq_len, in.element_bytes);
  }
  return compute_parts(in);
}

// The peak is the largest of three moments: the end of forward (the loss's chunk on top of what
// every layer kept), the start of backward (the head's casts), and the top layer's backward.
// Checkpointed, the layers keep their inputs only, and the layer in backward is recomputed first:
// its saved tensors and its output come back for the duration of its backward. Selective, every
// layer keeps its attention's results too, and the recompute brings back the rest.
namespace {

// What CUDA graphs keep under `setting` (layer_graphs.h; the header above) into row.graphs and
// row.graph_pools; nothing where they do not run.
void add_graphs(const ActivationInput& in, const ActivationParts& p, ActivationRow& row) {
  const Checkpointing setting = row.setting;
  if (!in.graphs || (setting != Checkpointing::kNone && setting != Checkpointing::kPlain)) return;
  const int64_t L = in.model.num_hidden_layers;
  const int64_t c = in.element_bytes;
  const int64_t buffers = (setting == Checkpointing::kPlain ? 6 : 4) * p.layer_input;
  const int64_t layer_params =
      in.head_trains && L > 0 ? (in.model.num_parameters(false) - in.model.hidden_size) / L : 0;
  const int64_t gathered = in.zero_stage == 3 ? in.model.num_parameters(true) : 0;
  row.graph_buffers = L * (buffers + c * layer_params);
  row.graphs = row.graph_buffers + c * gathered;
  const int64_t saved = (setting == Checkpointing::kNone ? L : 1) * p.layer_saved;
  row.graph_pools = row.graph_buffers + saved + p.layer_backward;
  row.device += row.graphs;
}

ActivationRow row_without_graphs(const ActivationInput& in, const ActivationParts& p,
                                 Checkpointing setting);

}  // namespace

ActivationRow activation_row(const ActivationInput& in, Checkpointing setting) {
  const ActivationParts p = activation_parts(in);
  ActivationRow row = row_without_graphs(in, p, setting);
  add_graphs(in, p, row);
  return row;
}

namespace {

ActivationRow row_without_graphs(const ActivationInput& in, const ActivationParts& p,
                                 Checkpointing setting) {
  const int64_t L = in.model.num_hidden_layers;
  ActivationRow row;
  row.setting = setting;
  const int64_t head = p.head_saved + std::max(p.loss_transient, p.head_backward);
  if (setting == Checkpointing::kNone) {
    row.device = p.context + L * p.layer_saved + std::max(head, p.layer_backward);
    return row;
  }
  if (setting == Checkpointing::kSelective) {
    // On a GPU the recompute's attention keeps k and v repeated to the query heads.
    const Shape s = shape_of(in.model);
    const int64_t repeated_kv = in.cuda ? p.tokens * in.element_bytes * 2 * (s.HD - s.KVD) : 0;
    const int64_t recompute =
        p.layer_saved - p.layer_attention + repeated_kv + p.layer_input + p.layer_backward;
    row.device = p.context + L * (p.layer_input + p.layer_attention) + std::max(head, recompute);
    return row;
  }
  const int64_t recompute = p.layer_saved + p.layer_input + p.layer_backward;
  // On a GPU the offloaded inputs leave the device: the one being recomputed and the next one
  // (fetched ahead) remain. On the CPU the host is the device: offload is plain checkpointing.
  const bool off = setting == Checkpointing::kOffload && in.cuda;
  const int64_t inputs = (off ? std::min<int64_t>(2, L) : L) * p.layer_input;
  row.host = off ? L * p.layer_input : 0;
  row.device = p.context + inputs + std::max(head, recompute);
  return row;
}

}  // namespace

std::vector<ActivationRow> activation_rows(const ActivationInput& in) {
  return {activation_row(in, Checkpointing::kNone), activation_row(in, Checkpointing::kSelective),
          activation_row(in, Checkpointing::kPlain), activation_row(in, Checkpointing::kOffload)};
}

ActivationInput activation_input(const config::Config& config, const model::ModelConfig& model,
                                 bool cuda) {
  ActivationInput in;
  in.model = model;
  in.micro_batch = config.training.per_device_train_batch_size;
  in.seq_len = config.data.max_length;
  in.sp_size = config.parallel.sequence_parallel_size;
  const bool half = config.training.bf16 || config.training.fp16;
  in.element_bytes = half ? 2 : 4;
  in.cuda = cuda;
  // The kernels take float32 and bfloat16 (fused_layer_ops.h): float16 runs the eager ops.
  in.fused_kernels = cuda && !config.training.fp16;
  in.tiled_mlp = config.model.tiled_mlp;
  in.fused_loss = config.model.fused_loss;
  in.loss_chunk_bytes =
      config.model.fused_loss_chunk_mb > 0 ? config.model.fused_loss_chunk_mb << 20 : 0;
  in.head_trains = !config.lora.enabled;
  in.graphs = cuda && config.training.cuda_graphs == "on" &&
              config.parallel.sequence_parallel_size <= 1 && config.model.tiled_mlp == 0;
  in.zero_stage = config.zero.stage;
  return in;
}

CheckpointingChoice choose_checkpointing(const std::vector<ActivationRow>& rows,
                                         int64_t model_states, int64_t limit) {
  CheckpointingChoice choice;
  choice.limit = limit;
  for (const ActivationRow& r : rows) {
    choice.settings.push_back(r.setting);
    choice.peaks.push_back(model_states + r.device);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (choice.peaks[i] <= limit) {
      choice.setting = rows[i].setting;
      return choice;
    }
  }
  // Nothing fits: the smallest peak, the earlier (faster) setting on a tie.
  const auto smallest = std::min_element(choice.peaks.begin(), choice.peaks.end());
  choice.setting = rows.at(static_cast<size_t>(smallest - choice.peaks.begin())).setting;
  choice.fits = false;
  return choice;
}

std::string describe_choice(const CheckpointingChoice& choice) {
  std::string peaks;
  for (size_t i = 0; i < choice.peaks.size() && i < choice.settings.size(); ++i) {
    peaks += fmt::format("{}{} {}", i ? ", " : "", setting_name(choice.settings[i]),
                         human_bytes(choice.peaks[i]));
  }
  return fmt::format(
      "gradient_checkpointing: auto chose {}{}: predicted peak (model states + activations) {}; "
      "limit {}",
      checkpointing_word(choice.setting),
      choice.fits ? "" : " (the smallest; no setting is predicted to fit)", peaks,
      human_bytes(choice.limit));
}

std::string format_activations(const ActivationInput& in) {
  const ActivationParts p = activation_parts(in);
  std::string out = fmt::format(
      "Activations per rank: micro-batch {} x {} tokens{} ({} tokens), {}-byte activations, {}{}; "
      "one layer keeps {} for backward, its input is {}, its attention's output and statistics "
      "{}; the head keeps {}.\n\n",
      in.micro_batch, in.seq_len,
      in.sp_size > 1 ? fmt::format(" / {} sequence-parallel ranks", in.sp_size) : "", p.tokens,
      in.element_bytes,
      in.fused_kernels ? "fused GPU kernels" : (in.cuda ? "GPU, eager ops" : "CPU"),
      in.tiled_mlp != 0 ? ", tiled MLP" : "", human_bytes(p.layer_saved),
      human_bytes(p.layer_input), human_bytes(p.layer_attention), human_bytes(p.head_saved));
  if (in.graphs) {
    out += fmt::format(
        "CUDA graphs (training.cuda_graphs: on) keep, on top, their buffers{}{} where they run "
        "(gradient_checkpointing false or true): the column \"graphs\", part of the peak.\n\n",
        in.head_trains ? ", a gradient buffer per parameter of each layer" : "",
        in.zero_stage == 3 ? ", every parameter gathered (stage 3)" : "");
    out += fmt::format("{:<24}{:>14}{:>14}{:>14}\n", "gradient_checkpointing", "device peak",
                       "host", "graphs");
  } else {
    out += fmt::format("{:<24}{:>14}{:>14}\n", "gradient_checkpointing", "device peak", "host");
  }
  for (const ActivationRow& r : activation_rows(in)) {
    out += fmt::format("{:<24}{:>14}{:>14}", checkpointing_word(r.setting), human_bytes(r.device),
                       human_bytes(r.host));
    out += in.graphs ? fmt::format("{:>14}\n", human_bytes(r.graphs)) : "\n";
  }
  return out;
}

nlohmann::json activations_json(const ActivationInput& in) {
  const ActivationParts p = activation_parts(in);
  nlohmann::json rows = nlohmann::json::array();
  for (const ActivationRow& r : activation_rows(in)) {
    rows.push_back({{"gradient_checkpointing", checkpointing_word(r.setting)},
                    {"device", r.device},
                    {"host", r.host},
                    {"graphs", r.graphs}});
  }
  return {{"tokens", p.tokens},           {"layer_saved", p.layer_saved},
          {"layer_input", p.layer_input}, {"layer_attention", p.layer_attention},
          {"head_saved", p.head_saved},   {"rows", rows}};
}

}  // namespace dstrain::zero
