// Activation memory per checkpointing setting, from the model's blocks (activations.h).
#include "estimate/activations.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/bytes.h"
#include "core/error.h"
#include "model/rng_state.h"

namespace dstrain::estimate {
namespace {

model::ActivationRun run_of(const ActivationInput& in) {
  if (!in.model || in.micro_batch < 1 || in.seq_len < 1 || in.element_bytes < 1) {
    fail(ErrorKind::kInternal, "activation estimate: micro-batch {}, sequence {}, {}-byte dtype{}",
         in.micro_batch, in.seq_len, in.element_bytes, in.model ? "" : ", no model");
  }
  model::ActivationRun run;
  run.tokens = in.micro_batch * in.seq_len / std::max<int64_t>(1, in.sp_size);
  run.element_bytes = in.element_bytes;
  run.cuda = in.cuda;
  run.fused_kernels = in.fused_kernels;
  run.tiled_mlp = in.tiled_mlp;
  run.fused_loss = in.fused_loss;
  run.loss_chunk_bytes = in.loss_chunk_bytes;
  run.weights_train = in.head_trains;
  return run;
}

// What block `b` holds under `setting`: checkpointing wraps the layer blocks only.
model::ActivationMemory memory_of(const model::ModelBlock& b, const model::ActivationRun& run,
                                  Checkpointing setting) {
  return b.block->activation_memory(
      run, b.role == model::BlockRole::kLayer ? setting : Checkpointing::kNone);
}

// cos and sin [T, D] of the rank's positions, which every layer reads.
int64_t rope_tables(const ActivationInput& in) {
  return 2 * (in.seq_len / std::max<int64_t>(1, in.sp_size)) * in.model->config().head_dim *
         in.element_bytes;
}

const model::ModelBlock* first_of(const ActivationInput& in, model::BlockRole role) {
  for (const auto& b : in.model->blocks()) {
    if (b->role == role) return b.get();
  }
  return nullptr;
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

ActivationParts activation_parts(const ActivationInput& in) {
  const model::ActivationRun run = run_of(in);
  ActivationParts p;
  p.tokens = run.tokens;
  p.context = rope_tables(in);
  if (const model::ModelBlock* layer = first_of(in, model::BlockRole::kLayer)) {
    const model::ActivationMemory none = memory_of(*layer, run, Checkpointing::kNone);
    p.layer_saved = none.kept;
    p.layer_input = none.input;
    p.layer_backward = none.backward;
    p.layer_attention = memory_of(*layer, run, Checkpointing::kSelective).kept - none.input;
  }
  if (const model::ModelBlock* head = first_of(in, model::BlockRole::kHead)) {
    const model::ActivationMemory m = memory_of(*head, run, Checkpointing::kNone);
    p.head_saved = m.kept;
    p.loss_transient = m.forward;
    p.head_backward = m.backward;
  }
  return p;
}

namespace {

// What each checkpointed call keeps besides what its block says: the random generators' states
// (model/rng_state.h), so that the recompute draws what the forward drew. They are host tensors:
// on the CPU the CPU generator's state (5,056 bytes), nothing on a GPU's device.
int64_t checkpoint_rng_bytes(const ActivationInput& in) {
  return in.cuda ? 0 : model::capture_rng({}).cpu.nbytes();
}

// The peak of the moments (activations.h) under `setting`, and the host part.
ActivationRow row_without_graphs(const ActivationInput& in, Checkpointing setting) {
  const model::ActivationRun run = run_of(in);
  const int64_t rng = setting == Checkpointing::kNone ? 0 : checkpoint_rng_bytes(in);
  ActivationRow row;
  row.setting = setting;
  const auto& blocks = in.model->blocks();
  std::vector<std::pair<size_t, size_t>> chunks = in.chunks;
  if (chunks.empty()) chunks = {{0, blocks.size()}};
  int64_t chunk_kept = 0, peak = 0, fetched = 0, fetched_next = 0;
  for (const auto& [first, end] : chunks) {
    int64_t kept = 0;
    for (size_t i = first; i < end; ++i) {
      const model::ModelBlock& b = *blocks.at(i);
      const model::ActivationMemory m = memory_of(b, run, setting);
      kept += m.kept + (b.role == model::BlockRole::kLayer ? rng : 0);
      row.host += m.host;
      peak = std::max(peak, kept + std::max(m.forward, m.backward));
      // The two largest host parts: the offload store's inputs on the device.
      if (m.host > fetched) {
        fetched_next = fetched;
        fetched = m.host;
      } else {
        fetched_next = std::max(fetched_next, m.host);
      }
    }
    chunk_kept = std::max(chunk_kept, kept);
  }
  const int64_t others = std::max<int64_t>(0, in.in_flight - 1);
  row.host *= std::max<int64_t>(1, in.in_flight);
  row.device = rope_tables(in) + fetched + fetched_next + others * chunk_kept + peak;
  return row;
}

// What CUDA graphs keep under `setting` (model/layer_graphs.h; the header above) into
// row.graphs and row.graph_pools; nothing where they do not run.
void add_graphs(const ActivationInput& in, ActivationRow& row) {
  const Checkpointing setting = row.setting;
  if (!in.graphs || (setting != Checkpointing::kNone && setting != Checkpointing::kPlain)) return;
  const model::ActivationRun run = run_of(in);
  const int64_t c = in.element_bytes;
  int64_t saved = 0, largest_saved = 0, backward = 0, gathered = 0;
  for (const auto& b : in.model->blocks()) {
    int64_t params = 0;
    for (const model::BlockParameter& p : b->parameters) params += p.tensor.numel();
    gathered += params;
    if (b->role != model::BlockRole::kLayer) continue;
    const model::ActivationMemory m = memory_of(*b, run, Checkpointing::kNone);
    const int64_t buffers = (setting == Checkpointing::kPlain ? 6 : 4) * m.input;
    row.graph_buffers += buffers + (in.head_trains ? c * params : 0);
    saved += m.kept;
    largest_saved = std::max(largest_saved, m.kept);
    backward = std::max(backward, m.backward);
  }
  row.graphs = row.graph_buffers + (in.zero_stage == 3 ? c * gathered : 0);
  row.graph_pools =
      row.graph_buffers + (setting == Checkpointing::kNone ? saved : largest_saved) + backward;
  row.device += row.graphs;
}

}  // namespace

ActivationRow activation_row(const ActivationInput& in, Checkpointing setting) {
  ActivationRow row = row_without_graphs(in, setting);
  add_graphs(in, row);
  return row;
}

std::vector<ActivationRow> activation_rows(const ActivationInput& in) {
  std::vector<ActivationRow> rows;
  for (const Checkpointing s : model::kCheckpointingSettings) rows.push_back(activation_row(in, s));
  return rows;
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
      model::checkpointing_word(choice.setting),
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
    out += fmt::format("{:<24}{:>14}{:>14}", model::checkpointing_word(r.setting),
                       human_bytes(r.device), human_bytes(r.host));
    out += in.graphs ? fmt::format("{:>14}\n", human_bytes(r.graphs)) : "\n";
  }
  return out;
}

nlohmann::json activations_json(const ActivationInput& in) {
  const ActivationParts p = activation_parts(in);
  nlohmann::json rows = nlohmann::json::array();
  for (const ActivationRow& r : activation_rows(in)) {
    rows.push_back({{"gradient_checkpointing", model::checkpointing_word(r.setting)},
                    {"device", r.device},
                    {"host", r.host},
                    {"graphs", r.graphs}});
  }
  return {{"tokens", p.tokens},           {"layer_saved", p.layer_saved},
          {"layer_input", p.layer_input}, {"layer_attention", p.layer_attention},
          {"head_saved", p.head_saved},   {"rows", rows}};
}

}  // namespace dstrain::estimate
