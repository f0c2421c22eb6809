// `dstrain estimate`: the memory model of a run config, without a device.
#include <nlohmann/json.hpp>

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "hub/resolve.h"
#include "train/run_plan.h"

namespace dstrain::train {
namespace {

// The loaded config of per_device_train_batch_size: auto holds micro-batch 1 (config.h): say so
// rather than let the table pass for the run's.
std::string auto_micro_batch_note(const config::TrainingSection& t) {
  if (!t.micro_batch_auto) return "";
  return fmt::format(
      "\nNote: training.per_device_train_batch_size is auto: the activations above are per "
      "micro-batch of {}; the run picks the largest micro-batch of its {} samples per rank that "
      "fits when it starts (docs/training.md, Micro-batch auto).\n",
      t.per_device_train_batch_size, t.per_device_train_batch_size * t.gradient_accumulation_steps);
}

// Under expert parallelism: what each rank holds of the experts, and the dropless dispatch's
// average and worst case of the rows a rank's experts receive from one micro-batch.
struct ExpertShare {
  int64_t size = 1, local = 0, experts = 0, replicas = 1;
  int64_t average_rows = 0, worst_rows = 0, row_bytes = 0;
};

ExpertShare expert_share(const RunMemory& memory) {
  const config::Config& c = memory.config();
  const model::ModelConfig& m = memory.model()->config();
  ExpertShare s;
  s.size = c.parallel.expert_parallel_size;
  s.experts = m.moe.experts;
  s.local = s.experts / s.size;
  s.replicas = memory.layout().size(layout::Axis::kExpertData);
  const int64_t tokens = c.training.per_device_train_batch_size * c.data.max_length /
                         c.parallel.sequence_parallel_size;
  s.average_rows = tokens * m.moe.top_k;
  // A token's k experts are distinct: at most min(k, E/E_p) of them on one rank.
  s.worst_rows = s.size * tokens * std::min(m.moe.top_k, s.local);
  s.row_bytes = m.hidden_size * (c.training.bf16 || c.training.fp16 ? 2 : 4);
  return s;
}

}  // namespace

std::string estimate_report(const std::string& config_path,
                            const std::vector<std::string>& overrides, int world_size, bool json) {
  if (world_size < 1)
    fail(ErrorKind::kUsage, "estimate: the world size is {}; expected >= 1", world_size);
  config::LoadOptions load;
  load.overrides = overrides;
  load.world_size = world_size;
  const config::Config config = config::load_config(config_path, load);
  // Only config.json is read: a hub id not cached is fetched without its weights.
  const auto dir =
      hub::resolve_model_dir({config.model.name_or_path, config.model.revision, /*weights=*/false});
  // The ranks are GPUs: activations as the fused kernels keep them (estimate/activations.h).
  const RunMemory memory(config, model::load_model_config(dir), world_size, /*cuda=*/true);
  const int P = memory.pipeline_ranks();
  const int64_t T = config.parallel.tensor_parallel_size;
  if (!json) {
    std::string out =
        T == 1 ? ""
               : fmt::format(
                     "Tensor parallelism {}: each rank holds 1/{} of every layer, the embedding "
                     "and the head; below, one slice on the {} ranks that hold it.\n",
                     T, T, memory.layout().group_size(layout::kSliceReplicas));
    const model::MoeConfig& moe = memory.model()->config().moe;
    if (moe.experts > 0) {
      out += fmt::format(
          "Mixture-of-Experts: {} parameters, {} of them active for a token ({} of the {} experts "
          "of each MoE layer); the model states below hold {}, and the activations are the "
          "same whatever the routing (each token's {} rows through the experts).\n",
          memory.model()->config().num_parameters(true),
          memory.model()->config().num_parameters(true, /*active=*/true), moe.top_k, moe.experts,
          memory.expert_parallel() ? "this rank's share of the experts" : "them all", moe.top_k);
    }
    const bool ep = memory.expert_parallel();
    if (ep) {
      const ExpertShare e = expert_share(memory);
      out += fmt::format(
          "Expert parallelism {}: each rank holds {} of the {} experts of every MoE layer, sharded "
          "over the {} rank(s) that hold the same ones (the second table below); the rest of the "
          "model as the first. Dropless dispatch: a rank's experts compute {} token rows of a "
          "micro-batch on average and at worst {} (every token of its group choosing {} of its "
          "experts): {:.1f} MiB for one MoE layer's received rows alone, against {:.1f} MiB on "
          "average.\n",
          e.size, e.local, e.experts, e.replicas, e.average_rows, e.worst_rows,
          std::min(moe.top_k, e.local), static_cast<double>(e.worst_rows * e.row_bytes) / (1 << 20),
          static_cast<double>(e.average_rows * e.row_bytes) / (1 << 20));
    }
    // Each pipeline rank holds its stages' blocks and what its schedule keeps in flight.
    for (int p = 0; p < P; ++p) {
      if (P > 1) {
        const estimate::ActivationInput a = memory.activations(0, false, p);
        std::string blocks;
        for (const auto& [first, end] : a.chunks) {
          blocks += fmt::format("{}{}-{}", blocks.empty() ? "" : ", ", first, end - 1);
        }
        out += fmt::format(
            "{}Pipeline rank {} of {} (blocks {}; block 0 the embedding, {} the head), {} "
            "micro-batch chunk(s) in flight at its fullest:\n",
            p == 0 ? "" : "\n", p, P, blocks, memory.stages().back().second - 1, a.in_flight);
      }
      out += estimate::format_estimate(memory.model_states_input(p), dir.string()) + "\n";
      if (ep) {
        out +=
            estimate::format_estimate(memory.model_states_input(p, model::PlacementGroup::kExpert),
                                      dir.string() + " (this rank's experts)") +
            "\n";
      }
      if (const int64_t tied = memory.tied_copy(p); tied > 0) {
        out += fmt::format(
            "The head's rank also holds a copy of the tied embedding beside these: {:.1f} MiB "
            "(the matrix in the compute dtype{}).\n",
            static_cast<double>(tied) / (1 << 20),
            config.lora.enabled ? "" : "; training it, its gradient's float32 sum over the step");
      }
      out += estimate::format_activations(memory.activations(0, false, p));
    }
    return out + auto_micro_batch_note(config.training);
  }
  const auto stage_json = [&](int p) {
    nlohmann::json out = nlohmann::json::parse(
        estimate::format_estimate_json(memory.model_states_input(p), dir.string()));
    out["activations"] = estimate::activations_json(memory.activations(0, false, p));
    if (memory.expert_parallel()) {
      out["experts"] = nlohmann::json::parse(estimate::format_estimate_json(
          memory.model_states_input(p, model::PlacementGroup::kExpert), dir.string()));
    }
    return out;
  };
  nlohmann::json out = stage_json(0);
  if (memory.model()->config().moe.experts > 0) {
    out["active_parameters"] = memory.model()->config().num_parameters(true, /*active=*/true);
  }
  if (memory.expert_parallel()) {
    const ExpertShare e = expert_share(memory);
    out["expert_parallel"] = {{"size", e.size},
                              {"experts_per_rank", e.local},
                              {"expert_replicas", e.replicas},
                              {"dispatch_rows_average", e.average_rows},
                              {"dispatch_rows_worst", e.worst_rows},
                              {"row_bytes", e.row_bytes}};
  }
  if (P > 1) {
    out["pipeline_stages"] = nlohmann::json::array();
    for (int p = 0; p < P; ++p) {
      nlohmann::json stage = stage_json(p);
      const estimate::ActivationInput a = memory.activations(0, false, p);
      stage["pipeline_rank"] = p;
      stage["chunks"] = a.chunks;
      stage["in_flight"] = a.in_flight;
      stage["tied_embedding_copy_bytes"] = memory.tied_copy(p);
      out["pipeline_stages"].push_back(std::move(stage));
    }
  }
  return out.dump(2) + "\n";
}

}  // namespace dstrain::train
