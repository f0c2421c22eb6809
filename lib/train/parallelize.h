#pragma once
// Parallelism applied to a model (torchtitan's parallelize, in LibTorch): the model is a list of
// blocks (model/blocks.h) and everything here acts on that list, so a new kind of block is
// parallelized with no change to this file.
//
// A run's parallelize() (the first overload) starts from the layout (layout/parallel_layout.h):
//   a. the layout's groups are cut from the world (ParallelGroups), and the tensor- and
//      sequence-parallel groups made over them;
//   b. tensor parallelism: the model is built, without memory, as this rank's slice for its
//      tensor-parallel group (model/tensor_parallel.h: Megatron's column/row/vocabulary splits,
//      each parameter's placement declared by its module), and the whole model's initial values
//      are read as that slice (slice_source);
//   c. with CUDA graphs, the one stream the rank trains on, before the engine exists;
// then goes on as the second overload, given a model, does:
//   1. LoRA (plan.lora): every base parameter frozen, adapters added to the projections the
//      targets select (lora/targets.h); the adapters belong to the block of their projection.
//   2. Sequence parallelism: every block's attention runs the group's Ulysses core
//      (sequence_parallel.h; nothing for a group of one).
//   3. Tiled MLP in every block (plan.tiled_mlp), the fused loss's chunk.
//   4. CUDA graphs per layer (plan.graph_recorder, model/layer_graphs.h): the innermost wrapper,
//      around the layer's own forward.
//   5. Activation checkpointing of every layer block (plan.checkpointing, model/checkpointing.h),
//      its input optionally offloaded to the host, or keeping its attention's results too
//      (selective, model/selective_attention.h): inside the engine's wrapper, so
//      that ZeRO-3's gathers are not repeated in its recompute; its recompute replays the graphs.
//   6. The parameters and adapters are placed on the device (parameters without memory stay
//      without memory there).
//   7. ZeRO: the engine is built over the parameters of this rank's pipeline stages' blocks, each
//      with its block as its stage-3 unit (stage 3's units are the blocks, and each forward
//      segment a block with the blocks it shares parameters with: the tied head reads the
//      embedding's), frozen when LoRA froze it, then the adapters. Every parameter gets its
//      initial values from plan.initial_values (the adapters from their own), at every stage:
//      stages 0-2 fill their flat buffers and stage 3 only its shards. Its wrapper, the
//      outermost, brackets every block's run with Engine::pre_forward/post_forward (no-ops at
//      stages 0-2; at stage 3 the block's units are gathered before it runs and released after,
//      and gathered again for its backward).
//   8. Pipeline parallelism: this rank's stages (plan.stages over the pipeline group; one stage of
//      every block without it) as a PipelineStage over the engine, through which every step and
//      evaluation runs (pipeline.h).
//
// The model must be built without memory (model::Materialize::kNo) or hold its values; after
// parallelize() it trains through the stage (or, in tests, its forwards through the engine).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "comm/communicator.h"
#include "layout/parallel_layout.h"
#include "lora/lora_model.h"
#include "model/layer_graphs.h"
#include "model/model.h"
#include "train/parallel_groups.h"
#include "train/pipeline.h"
#include "train/sequence_parallel.h"
#include "train/tensor_parallel.h"
#include "zero/engine.h"

namespace dstrain::train {

struct LoraPlan {
  lora::LoraOptions options;
  std::string key;                      // the config key errors name
  std::vector<lora::LoraWeights> load;  // initial adapter weights (lora.init_from), else empty
  std::string load_source;              // where `load` came from, for errors
};

struct ParallelPlan {
  std::optional<LoraPlan> lora;
  int64_t tiled_mlp = 0;  // model::kTiledMlpOff, kTiledMlpAuto or tokens per tile
  model::Checkpointing checkpointing = model::Checkpointing::kNone;  // of the layer blocks
  // CUDA graphs per layer (model/layer_graphs.h) made by this recorder; null: none. Stage 3 then
  // keeps each unit's gathered memory (the graphs read the parameters where they were recorded).
  // Not with sequence parallelism, tiled MLP, selective checkpointing or offload (graphs_choice.h).
  std::shared_ptr<model::Recorder> graph_recorder;
  int64_t graph_pool_budget = 0;  // model::LayerGraphOptions::pool_budget (0: none)
  double graph_min_speedup = 0;   // model::LayerGraphOptions::min_speedup (0: none)
  int64_t loss_chunk_bytes = 0;   // the fused loss's chunk (model.fused_loss_chunk_mb); 0: default
  // Every (virtual) pipeline stage's blocks (pipeline.h), over the pipeline group's ranks: this
  // rank trains its stages' blocks, the engine holds their parameters alone, and the others stay
  // without memory. Empty: one stage of every block.
  StageRanges stages;
  StageOptions stage;          // its engine is parallelize()'s
  zero::EngineOptions engine;  // its stage picks the engine; initial_values is set here
  zero::OptimizerFactory optimizer;
  // The model's parameters by name (files or a seeded init): the whole model's for a run's
  // parallelize() (it reads this rank's slices), the given model's shapes for the second overload.
  model::ValueSource initial_values;
  bool tensor_sequence_parallel = false;  // a run's: parallel.tensor_sequence_parallel
};

// Where the given model runs: the communicator ZeRO shards over, the device, the sequence-parallel
// groups and the pipeline's (null: one stage).
struct ParallelWorld {
  comm::Communicator& comm;
  torch::Device device;
  SequenceParallel& sequence_parallel;
  comm::Communicator* pipeline = nullptr;
};

// What parallelize() made, owned together and taken apart in the one order that is safe (reset(),
// the destructor): the pipeline stage (it runs the model and the engine), the model's wrappers
// (they refer to the engine and the graphs), the engine (its hooks and buffers hold the
// parameters, the adapters' included), the graphs, the adapters (they leave the model's
// projections), the model, the training stream (the engine's gradient accumulators were made on
// it), and the groups the model's collectives ran over.
struct Parallelized {
  std::unique_ptr<ParallelGroups> groups;                  // a run's parallelize() only
  std::shared_ptr<TensorParallelGroup> tensor_parallel;    // a run's; the model shares it
  std::unique_ptr<SequenceParallel> sequence_parallel;     // a run's
  std::unique_ptr<model::TrainingStream> training_stream;  // a run's with CUDA graphs
  model::DecoderModel model{nullptr};
  std::unique_ptr<lora::LoraModel> lora;       // null without LoRA
  std::shared_ptr<model::LayerGraphs> graphs;  // null without plan.graph_recorder
  std::unique_ptr<zero::Engine> engine;
  std::unique_ptr<PipelineStage> stage;  // this rank's stages: every step and evaluation

  Parallelized() = default;
  Parallelized(Parallelized&& other) noexcept = default;
  Parallelized& operator=(Parallelized&& other) noexcept;
  ~Parallelized() { reset(); }
  void reset() noexcept;
};

// A run: the layout's groups cut from `world`, the model (`config`: its config.json) built for this
// rank's place in `layout`, then parallelized as below. Collective. Keep `world` alive for as long
// as the result.
Parallelized parallelize(comm::Communicator& world, const layout::ParallelLayout& layout,
                         torch::Device device, const model::ModelConfig& config, ParallelPlan plan);

// A given model (tensor-parallel or not as it was built). Collective (the engine's
// construction). Keep `world` alive for as long as the result.
Parallelized parallelize(model::DecoderModel model, const ParallelWorld& world, ParallelPlan plan);

// The engine's parameters: every model parameter block by block with its block as its unit,
// frozen when it does not require grad, then the adapters of `lora` (if any) with the block of
// the projection they adapt; only those of `blocks` when it is not empty.
std::vector<zero::NamedParameter> engine_parameters(const model::DecoderModelImpl& model,
                                                    const lora::LoraModel* lora,
                                                    const std::vector<size_t>& blocks = {});

// What each forward segment (block) reads: the block and the blocks it shares parameters with.
std::vector<std::vector<int>> block_segments(const model::DecoderModelImpl& model);

}  // namespace dstrain::train
