#include "train/run_plan.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "train/component_options.h"
#include "train/expert_parallel.h"
#include "train/tensor_parallel.h"

namespace dstrain::train {

std::optional<model::Checkpointing> checkpointing_setting(const config::Config& c) {
  return model::checkpointing_from_word(c.model.gradient_checkpointing);
}

namespace {

// The shapes of one rank of a tensor-parallel group; null without tensor parallelism.
std::shared_ptr<model::TensorParallel> model_group(const config::ParallelSection& p) {
  if (p.tensor_parallel_size <= 1) return nullptr;
  return tensor_parallel_shapes(static_cast<int>(p.tensor_parallel_size),
                                p.tensor_sequence_parallel);
}

// The shapes of one rank of an expert-parallel group; null without expert parallelism.
std::shared_ptr<model::ExpertParallel> expert_group(const config::ParallelSection& p) {
  if (p.expert_parallel_size <= 1) return nullptr;
  return expert_parallel_shapes(static_cast<int>(p.expert_parallel_size));
}

StageRanges pipeline_stages(const config::Config& c, const model::DecoderModelImpl& model,
                            int pipeline) {
  const int parts = pipeline * static_cast<int>(c.parallel.pipeline_virtual_stages);
  if (c.parallel.pipeline_split.empty()) {
    return balance_stages(block_costs(model), parts, "parallel.pipeline_parallel_size");
  }
  std::vector<int64_t> layers;
  for (const std::string& n : c.parallel.pipeline_split) layers.push_back(std::stoll(n));
  return split_stages(layers, model, c.source_path + ": parallel.pipeline_split");
}

// On more than one rank: the layout, the pipeline's stages and what its schedule idles.
void layout_lines(const RunPlan& plan, const config::Config& c, std::vector<PlanLine>& lines) {
  const layout::ParallelLayout& l = plan.layout;
  if (l.world_size() == 1) return;
  const bool region_sp = l.size(layout::Axis::kTensor) > 1 && c.parallel.tensor_sequence_parallel;
  lines.push_back(
      {false, fmt::format(
                  "parallel layout: {}{}", l.describe(),
                  region_sp ? ", sequence parallelism between the layers' parallel regions" : "")});
  const int p = l.size(layout::Axis::kPipeline);
  if (p == 1) return;
  std::string said;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const auto& [first, end] = plan.stages[s];
    said += fmt::format("{}{}: blocks {}-{}", s == 0 ? "" : "; ", s, first, end - 1);
  }
  lines.push_back({false, fmt::format("pipeline stages (block 0 the embedding, {} the head): {}",
                                      plan.stages.back().second - 1, said)});
  const int m = static_cast<int>(plan.accumulation);
  const int v = static_cast<int>(c.parallel.pipeline_virtual_stages);
  lines.push_back(
      {false,
       fmt::format("pipeline parallel: {} stages of {} rank(s), {} schedule, {} micro-batches a "
                   "step: each rank idles about {:.0f}% of a step (equal stages)",
                   p, l.group_size(layout::kStage),
                   v > 1 ? fmt::format("interleaved 1F1B ({} virtual stages a rank)", v)
                         : c.parallel.pipeline_schedule,
                   m, 100 * pipeline_bubble(p, m, v))});
  if (c.zero.stage == 2) {
    lines.push_back(
        {true, fmt::format("zero stage 2 with pipeline parallelism reduce-scatters the gradients "
                           "at each of a step's {} micro-steps; ZeRO 1 reduces them once a step "
                           "(and keeps each stage's gradients whole on its ranks)",
                           m * v)});
  }
}

}  // namespace

RunMemory::RunMemory(config::Config config, const model::ModelConfig& model, int world_size,
                     bool cuda)
    : config_(std::move(config)),
      model_(model, model::Materialize::kNo, model_group(config_.parallel),
             expert_group(config_.parallel)),
      layout_(layout::layout_of(config_.parallel, world_size)),
      stages_(pipeline_stages(config_, *model_, layout_.size(layout::Axis::kPipeline))),
      cuda_(cuda) {}

estimate::ActivationInput RunMemory::activations(int64_t micro, bool graphs, int stage) const {
  const config::Config& c = config_;
  estimate::ActivationInput in;
  in.model = model_;
  in.micro_batch = micro > 0 ? micro : c.training.per_device_train_batch_size;
  in.seq_len = c.data.max_length;
  in.sp_size = c.parallel.sequence_parallel_size;
  in.element_bytes = c.training.bf16 || c.training.fp16 ? 2 : 4;
  in.cuda = cuda_;
  // The kernels take float32 and bfloat16 (model/fused_layer_ops.h): float16 runs the eager ops.
  in.fused_kernels = cuda_ && !c.training.fp16;
  in.tiled_mlp = c.model.tiled_mlp;
  in.fused_loss = c.model.fused_loss;
  in.loss_chunk_bytes = c.model.fused_loss_chunk_mb > 0 ? c.model.fused_loss_chunk_mb << 20 : 0;
  in.head_trains = !c.lora.enabled;
  in.graphs = (graphs || c.training.cuda_graphs == "on") && cuda_ &&
              c.parallel.sequence_parallel_size <= 1 && c.model.tiled_mlp == 0;
  in.zero_stage = static_cast<int>(c.zero.stage);
  const int P = pipeline_ranks();
  if (P == 1) return in;
  for (size_t s = static_cast<size_t>(stage); s < stages_.size(); s += static_cast<size_t>(P)) {
    in.chunks.push_back(stages_[s]);
  }
  const config::TrainingSection& t = c.training;
  const int64_t m =
      micro > 0 && t.micro_batch_auto ? samples_per_rank(t) / micro : t.gradient_accumulation_steps;
  const auto v = static_cast<int>(c.parallel.pipeline_virtual_stages);
  in.in_flight =
      in_flight_chunks(pipeline_schedule(pipeline_schedule_of(c), P, stage, static_cast<int>(m), v,
                                         "training.gradient_accumulation_steps"));
  return in;
}

estimate::EstimateInput RunMemory::model_states_input(int stage,
                                                      model::PlacementGroup group) const {
  estimate::EstimateInput in;
  const int P = pipeline_ranks();
  for (estimate::ParamShape& p : estimate::parameter_shapes(
           *model_, P == 1 ? std::vector<size_t>{} : rank_blocks(stages_, P, stage))) {
    if (p.group == group) in.params.push_back(std::move(p));
  }
  // ZeRO shards a rank's slice of its stage over the ranks that hold it, its experts over the
  // ranks that hold the same ones.
  in.world_size = group == model::PlacementGroup::kExpert
                      ? layout_.size(layout::Axis::kExpertData)
                      : layout_.group_size(layout::kSliceReplicas);
  in.compute_bytes = config_.training.bf16 || config_.training.fp16 ? 2 : 4;
  const auto& opt = config_.training.optimizer;
  in.optimizer_bytes = opt.type == "sgd" ? (opt.momentum != 0 ? 4 : 0) : 8;
  in.param_persistence_threshold = config_.zero.stage3_param_persistence_threshold;
  return in;
}

int64_t RunMemory::model_states(int stage) const {
  const auto device = [&](const estimate::EstimateInput& in) {
    return estimate::estimate_row(in, static_cast<int>(config_.zero.stage),
                                  config_.zero.offload_optimizer.device == "cpu",
                                  config_.zero.offload_param.device == "cpu")
        .device();
  };
  int64_t bytes = device(model_states_input(stage)) + tied_copy(stage);
  if (expert_parallel()) bytes += device(model_states_input(stage, model::PlacementGroup::kExpert));
  return bytes;
}

int64_t RunMemory::tied_copy(int stage) const {
  return tied_copy_bytes(*model_, stages_, pipeline_ranks(), stage,
                         static_cast<int>(model_states_input(stage).compute_bytes),
                         !config_.lora.enabled);
}

int64_t RunMemory::peak(int64_t micro, model::Checkpointing setting) const {
  int64_t fullest = 0;
  for (int p = 0; p < pipeline_ranks(); ++p) {
    fullest = std::max(
        fullest,
        model_states(p) + estimate::activation_row(activations(micro, false, p), setting).device);
  }
  return fullest;
}

estimate::ActivationRow RunMemory::graphs(int64_t micro, model::Checkpointing setting) const {
  return estimate::activation_row(activations(micro, /*graphs=*/true), setting);
}

MicroBatchPlan plan_for_run(const RunMemory& memory, std::optional<model::Checkpointing> setting,
                            int64_t limit) {
  std::vector<model::Checkpointing> settings(model::kCheckpointingSettings.begin(),
                                             model::kCheckpointingSettings.end());
  if (setting) settings = {*setting};
  MicroBatchPlan plan;
  for (const model::Checkpointing s : settings) {
    plan = plan_micro_batch(
        samples_per_rank(memory.config().training),
        [&](int64_t micro) { return memory.peak(micro, s); }, limit);
    plan.checkpointing = s;
    if (plan.fits) break;
  }
  return plan;
}

estimate::CheckpointingChoice choose_stage_checkpointing(const RunMemory& memory, int64_t micro,
                                                         int64_t limit, int stage) {
  return estimate::choose_checkpointing(
      estimate::activation_rows(memory.activations(micro, false, stage)),
      memory.model_states(stage), limit);
}

estimate::CheckpointingChoice choose_checkpointing(const RunMemory& memory, int64_t micro,
                                                   int64_t limit) {
  if (memory.pipeline_ranks() == 1) return choose_stage_checkpointing(memory, micro, limit, 0);
  // Each setting's fullest pipeline rank, its model states included in its row.
  std::vector<estimate::ActivationRow> fullest;
  for (int p = 0; p < memory.pipeline_ranks(); ++p) {
    const std::vector<estimate::ActivationRow> rows =
        estimate::activation_rows(memory.activations(micro, false, p));
    for (size_t i = 0; i < rows.size(); ++i) {
      estimate::ActivationRow row = rows[i];
      row.device += memory.model_states(p);
      if (fullest.size() <= i) {
        fullest.push_back(row);
      } else if (row.device > fullest[i].device) {
        fullest[i] = row;
      }
    }
  }
  return estimate::choose_checkpointing(fullest, 0, limit);
}

bool needs_limit(const config::Config& c, bool cuda) {
  return c.training.micro_batch_auto || !checkpointing_setting(c) ||
         (c.training.cuda_graphs == "auto" && cuda);
}

RunPlan resolve_run_plan(const config::Config& config, const model::ModelConfig& model,
                         const RunFacts& facts) {
  if (needs_limit(config, facts.cuda) && facts.limit <= 0) {
    fail(ErrorKind::kInternal,
         "run plan: an auto choice needs the memory limit, and none is given");
  }
  RunPlan plan;
  plan.memory = std::make_shared<const RunMemory>(config, model, facts.world_size, facts.cuda);
  const RunMemory& memory = *plan.memory;
  plan.layout = memory.layout();
  plan.stages = memory.stages();
  plan.data_parallel = config.parallel.data_parallel(facts.world_size);
  const config::TrainingSection& t = config.training;
  const std::optional<model::Checkpointing> setting = checkpointing_setting(config);

  plan.micro_batch = t.per_device_train_batch_size;
  if (t.micro_batch_auto && facts.kept_micro_batch > 0) {
    plan.micro_batch = facts.kept_micro_batch;
    plan.micro_batch_kept = true;
  } else if (t.micro_batch_auto) {
    plan.micro_batch_auto = plan_for_run(memory, setting, facts.limit);
    plan.micro_batch = plan.micro_batch_auto->micro;
  }
  plan.accumulation =
      t.micro_batch_auto ? samples_per_rank(t) / plan.micro_batch : t.gradient_accumulation_steps;

  if (setting) {
    plan.checkpointing = *setting;
  } else {
    plan.checkpointing_auto = choose_checkpointing(memory, plan.micro_batch, facts.limit);
    plan.checkpointing = plan.checkpointing_auto->setting;
  }

  // (CUDA graphs, chosen for one setting, stay off in a pipeline: graphs_choice.h.)
  if (!setting && memory.pipeline_ranks() > 1) {
    for (int p = 0; p < memory.pipeline_ranks(); ++p) {
      plan.stage_checkpointing.push_back(
          choose_stage_checkpointing(memory, plan.micro_batch, facts.limit, p));
    }
  }

  GraphsMemory graphs_memory;
  if (t.cuda_graphs == "auto" && facts.cuda) {
    graphs_memory.peak = memory.peak(plan.micro_batch, plan.checkpointing);
    graphs_memory.peak_with_graphs =
        graphs_memory.peak + memory.graphs(plan.micro_batch, plan.checkpointing).graphs;
    graphs_memory.limit = facts.limit;
  }
  plan.graphs =
      choose_graphs(config, plan.checkpointing, facts.cuda, graphs_memory, model.moe.experts > 0);
  if (plan.graphs.on) {
    // The memory model's figure for the graphs' pools, exceeded by at most half (allocator
    // rounding, kernels' workspaces it does not model) before recording stops.
    const int64_t pools = memory.graphs(plan.micro_batch, plan.checkpointing).graph_pools;
    plan.graph_pool_budget = pools + pools / 2;
  }
  plan.tiled_mlp = config.model.tiled_mlp;
  plan.engine = engine_options(config);
  return plan;
}

void replan_micro_batch(RunPlan& plan, int64_t micro) {
  const int64_t samples = plan.micro_batch * plan.accumulation;
  if (micro < 1 || samples % micro != 0) {
    fail(ErrorKind::kInternal, "run plan: micro-batch {} does not divide the {} samples per rank",
         micro, samples);
  }
  plan.micro_batch = micro;
  plan.accumulation = samples / micro;
  if (plan.micro_batch_auto && plan.micro_batch_auto->micro != micro) {
    plan.micro_batch_auto->micro = micro;
    plan.micro_batch_auto->peak = plan.memory->peak(micro, plan.micro_batch_auto->checkpointing);
  }
}

std::vector<PlanLine> plan_lines(const RunPlan& plan, const config::Config& config) {
  std::vector<PlanLine> lines;
  const int64_t global = plan.micro_batch * plan.accumulation * plan.data_parallel;
  if (plan.micro_batch_kept) {
    lines.push_back({false, fmt::format("micro-batch auto: {} × accumulation {} = global {}, kept "
                                        "from the checkpoint",
                                        plan.micro_batch, plan.accumulation, global)});
  } else if (plan.micro_batch_auto) {
    lines.push_back({false, describe_plan(*plan.micro_batch_auto, plan.data_parallel)});
    if (!plan.micro_batch_auto->fits) {
      lines.push_back({true,
                       "micro-batch auto: not even micro-batch 1 is predicted to fit; its "
                       "trial step ran"});
    }
  }
  for (size_t p = 0; p < plan.stage_checkpointing.size(); ++p) {
    const estimate::CheckpointingChoice& choice = plan.stage_checkpointing[p];
    lines.push_back(
        {!choice.fits, fmt::format("pipeline rank {}: {}", p, estimate::describe_choice(choice))});
  }
  if (plan.checkpointing_auto && plan.stage_checkpointing.empty()) {
    lines.push_back(
        {!plan.checkpointing_auto->fits, estimate::describe_choice(*plan.checkpointing_auto)});
  }
  const std::string& graphs = config.training.cuda_graphs;
  if (plan.graphs.on && plan.graphs.min_speedup > 0) {
    lines.push_back({false, fmt::format("CUDA graphs: each decoder layer is recorded on its first "
                                        "step, checked and timed against its eager run; they stay "
                                        "where the replays are {}x faster",
                                        plan.graphs.min_speedup)});
  } else if (plan.graphs.on) {
    lines.push_back({false,
                     "CUDA graphs: each decoder layer is recorded on its first step and "
                     "replayed after"});
  } else if (graphs == "on") {
    lines.push_back({true, "training.cuda_graphs: on has no effect: " + plan.graphs.why_not});
  } else if (graphs == "auto" && plan.memory->cuda()) {
    lines.push_back({false, "CUDA graphs off: " + plan.graphs.why_not});
  }
  layout_lines(plan, config, lines);
  return lines;
}

}  // namespace dstrain::train
