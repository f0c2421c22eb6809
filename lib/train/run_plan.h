#pragma once
// The run plan: everything a run decides before it builds anything, decided in one place by one
// pure function of the config, the model's config.json and the facts of the world and the device,
// so that it can be tested without a model's memory or a device. The trainer carries it out.
//
// In order, each choice taking the ones before it as given:
//   1. the micro-batch and accumulation (training.per_device_train_batch_size: auto,
//      micro_batch_auto.h): kept from the checkpoint resumed when it recorded one for the same
//      data-parallel ranks, else the largest divisor of the samples per rank whose predicted peak
//      fits; with gradient_checkpointing: auto as well, under the first setting (fastest first)
//      that lets one fit;
//   2. activation checkpointing (model.gradient_checkpointing: auto): the fastest setting whose
//      predicted peak at that micro-batch fits (with pipeline parallelism each pipeline rank's
//      own, for its stages);
//   3. CUDA graphs (training.cuda_graphs, graphs_choice.h), with that checkpointing, and for auto
//      the memory the two choices above leave;
//   4. the engine's options (ZeRO stage, offload, buckets: component_options.h).
// Every prediction is the memory model's (lib/estimate) over the blocks of one model built
// without memory for the plan (RunMemory), against the planning limit (memory_limit.h). The limit
// is the same on every rank, so every rank resolves the same plan.
//
// What the plan chose is said once at start-up (plan_lines(): rank 0's log) and heads the
// config.yaml the run writes, as comments. The config keeps the user's words (`auto`): a resumed
// run plans again for the memory and ranks it finds.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "estimate/activations.h"
#include "estimate/model_states.h"
#include "layout/parallel_layout.h"
#include "model/checkpointing.h"
#include "model/model.h"
#include "train/graphs_choice.h"
#include "train/micro_batch_auto.h"
#include "train/pipeline.h"
#include "zero/engine.h"

namespace dstrain::train {

// model.gradient_checkpointing as a setting; none for `auto` (the plan's to choose).
std::optional<model::Checkpointing> checkpointing_setting(const config::Config& c);

// The memory model of one run: its config's shape of the work over the blocks of its model, built
// once without memory (model::Materialize::kNo: a 70B config builds in milliseconds).
class RunMemory {
 public:
  // `cuda`: the run's device is a GPU (the fused kernels then run for float32 and bfloat16; the
  // build and DSTRAIN_CUDA_KERNELS are not consulted here). With parallel.tensor_parallel_size > 1
  // the model has one rank's slices' shapes (tensor_parallel_shapes), and ZeRO shards it over
  // world_size / T ranks.
  // With pipeline parallelism each pipeline rank (`stage` below: its coordinate p) is planned for
  // what it holds: its stages' parameters, sharded over its stage's data-parallel ranks, and the
  // activations its schedule keeps in flight (estimate/activations.h).
  RunMemory(config::Config config, const model::ModelConfig& model, int world_size, bool cuda);

  const config::Config& config() const { return config_; }
  const model::DecoderModel& model() const { return model_; }
  bool cuda() const { return cuda_; }
  const layout::ParallelLayout& layout() const { return layout_; }
  // Every (virtual) pipeline stage's blocks: parallel.pipeline_split, else balanced by the
  // blocks' matrices (pipeline.h); one stage without pipeline parallelism.
  const StageRanges& stages() const { return stages_; }
  int pipeline_ranks() const { return layout_.size(layout::Axis::kPipeline); }

  // The activation input at micro-batch `micro` (the config's when 0) of pipeline rank `stage`:
  // the sequence, the sequence-parallel degree, the compute dtype (training.bf16 / fp16),
  // model.tiled_mlp, model.fused_loss and its chunk, LoRA, `graphs`: CUDA graphs counted where the
  // setting lets them run, and the rank's chunks and what its schedule keeps in flight.
  estimate::ActivationInput activations(int64_t micro = 0, bool graphs = false,
                                        int stage = 0) const;
  // The parameter shapes (pipeline rank `stage`'s), ranks, compute dtype, optimizer and stage-3
  // persistence threshold: of the parameters placed over `group` (under expert parallelism the
  // expert stacks, kExpert, shard over the ranks holding the same experts; the rest, kTensor, as
  // without it).
  estimate::EstimateInput model_states_input(
      int stage = 0, model::PlacementGroup group = model::PlacementGroup::kTensor) const;
  // Whether the model's experts are spread over ranks (parallel.expert_parallel_size > 1).
  bool expert_parallel() const { return layout_.size(layout::Axis::kExpert) > 1; }
  // The device bytes per rank of the model states at the run's ZeRO stage and offload, with the
  // head's rank's copy of a tied embedding (tied_copy_bytes).
  int64_t model_states(int stage = 0) const;
  // Pipeline rank `stage`'s bytes for a tied embedding outside its engine (tied_copy_bytes).
  int64_t tied_copy(int stage) const;
  // Model states + activations at micro-batch `micro` under `setting`, bytes per rank: the fullest
  // pipeline rank's.
  int64_t peak(int64_t micro, model::Checkpointing setting) const;
  // What CUDA graphs keep at micro-batch `micro` under `setting` (its graphs, graph_buffers and
  // graph_pools; estimate/activations.h), wherever the config lets them run.
  estimate::ActivationRow graphs(int64_t micro, model::Checkpointing setting) const;

 private:
  config::Config config_;
  model::DecoderModel model_;
  layout::ParallelLayout layout_;
  StageRanges stages_;
  bool cuda_;
};

// The micro-batch plan for `memory`'s config (micro_batch_auto set) with `limit` bytes per rank:
// plan_micro_batch() of its samples per rank under `setting`; with none (gradient_checkpointing:
// auto), under the settings that choice tries, fastest first, until one lets some micro-batch fit
// (no checkpointing whenever micro-batch 1 fits without; the checkpointing choice, made afterwards
// for that micro-batch, comes to the same setting). Nothing fitting: micro-batch 1 under the last
// setting, fits = false.
MicroBatchPlan plan_for_run(const RunMemory& memory, std::optional<model::Checkpointing> setting,
                            int64_t limit);

// gradient_checkpointing: auto for `memory`'s run at micro-batch `micro`:
// estimate::choose_checkpointing() of its rows against `limit`; with pipeline parallelism, of each
// setting's fullest pipeline rank (model states included): one setting for every rank.
estimate::CheckpointingChoice choose_checkpointing(const RunMemory& memory, int64_t micro,
                                                   int64_t limit);
// The same for pipeline rank `stage` alone: its own rows and model states.
estimate::CheckpointingChoice choose_stage_checkpointing(const RunMemory& memory, int64_t micro,
                                                         int64_t limit, int stage);

// What the plan is resolved against besides the config.
struct RunFacts {
  int world_size = 1;
  bool cuda = false;  // the ranks' device is a GPU
  // planning_limit(): bytes per rank the auto choices fit into; 0 when no choice needs it
  // (needs_limit()).
  int64_t limit = 0;
  // per_device_train_batch_size: auto: the micro-batch the checkpoint resumed recorded for this
  // run's data-parallel ranks and samples per rank; 0: none.
  int64_t kept_micro_batch = 0;
};

// Whether `c` on a GPU or not (`cuda`) has an auto choice that plans against the memory limit.
bool needs_limit(const config::Config& c, bool cuda);

struct RunPlan {
  layout::ParallelLayout layout;  // the ranks' mesh (layout/parallel_layout.h)
  // Every (virtual) pipeline stage's blocks: parallel.pipeline_split, else balanced by the blocks'
  // matrices (pipeline.h); one stage without pipeline parallelism.
  StageRanges stages;
  std::shared_ptr<const RunMemory> memory;         // one rank's model, built without memory
  int64_t micro_batch = 1;                         // per rank and micro-step
  int64_t accumulation = 1;                        // micro-steps per step
  bool micro_batch_kept = false;                   // auto, kept from the checkpoint resumed
  std::optional<MicroBatchPlan> micro_batch_auto;  // auto, chosen from the memory model
  // One setting for every rank (with auto, the fullest pipeline rank's choice).
  model::Checkpointing checkpointing = model::Checkpointing::kNone;
  std::optional<estimate::CheckpointingChoice> checkpointing_auto;  // gradient_checkpointing: auto
  // gradient_checkpointing: auto with pipeline parallelism: each pipeline rank's own choice for
  // its stages, fastest first (a rank holding fewer micro-batches in flight may need less);
  // empty: `checkpointing` everywhere.
  std::vector<estimate::CheckpointingChoice> stage_checkpointing;
  // Pipeline rank `stage`'s setting.
  model::Checkpointing checkpointing_of(int stage) const {
    return stage_checkpointing.empty() ? checkpointing
                                       : stage_checkpointing.at(static_cast<size_t>(stage)).setting;
  }
  GraphsChoice graphs;
  int64_t graph_pool_budget = 0;  // model::LayerGraphOptions::pool_budget with graphs on
  int64_t tiled_mlp = 0;          // model.tiled_mlp
  zero::EngineOptions engine;     // initial_values are the trainer's

  // Ranks that take different samples (world / sequence parallel / tensor parallel).
  int64_t data_parallel = 1;
};

// The plan for `config` with `model` (its config.json) on `facts`. Pure: the same inputs give the
// same plan on every rank. Error(kInternal) when an auto choice needs a limit and facts has none.
RunPlan resolve_run_plan(const config::Config& config, const model::ModelConfig& model,
                         const RunFacts& facts);

// The micro-batch `micro` instead of the plan's (the trainer's trial step found the planned one
// out of memory): accumulation and the auto plan's predicted peak follow.
void replan_micro_batch(RunPlan& plan, int64_t micro);

// What the plan chose, one line each (warning: nothing is predicted to fit, `on` has no effect,
// or a setting that costs more than it needs to), in order: the micro-batch (auto), checkpointing
// (auto), CUDA graphs, and on more than one rank the layout, the pipeline's stages and schedule.
struct PlanLine {
  bool warning = false;
  std::string text;
};
std::vector<PlanLine> plan_lines(const RunPlan& plan, const config::Config& config);

// `dstrain estimate`: loads the run config at `config_path` with `overrides` (key=value), reads
// its model's config.json (a hub id not cached is fetched without its weights) and returns the
// model states table and the activations of its micro-batch on GPUs (or with `json`, both as JSON)
// for `world_size` ranks. Errors: Error(kConfig) for the config, the model's errors for
// config.json.
std::string estimate_report(const std::string& config_path,
                            const std::vector<std::string>& overrides, int world_size,
                            bool json = false);

}  // namespace dstrain::train
