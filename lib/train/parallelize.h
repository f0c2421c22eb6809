#pragma once
// Parallelism applied to a model from outside (torchtitan's parallelize, in LibTorch): the model
// is a list of blocks (model/blocks.h) and everything here acts on that list, so a new kind of
// block is parallelized with no change to this file.
//
// parallelize() applies, in this order (each step sees the model as the steps before left it):
//   1. LoRA (plan.lora): every base parameter frozen, adapters added to the projections the
//      targets select (lora/targets.h); the adapters belong to the block of their projection.
//   2. Sequence parallelism: every block's attention runs the group's Ulysses core
//      (sequence_parallel.h; nothing for a group of one).
//   3. Tiled MLP in every block (plan.tiled_mlp).
//   4. CUDA graphs per layer (plan.graph_recorder, model/layer_graphs.h): the innermost wrapper,
//      around the layer's own forward.
//   5. Activation checkpointing of every layer block (plan.checkpointing, model/checkpointing.h),
//      its input optionally offloaded to the host, or keeping its attention's results too
//      (selective, model/selective_attention.h): inside the engine's wrapper, so
//      that ZeRO-3's gathers are not repeated in its recompute; its recompute replays the graphs.
//   6. The parameters and adapters are placed on the device (parameters without memory stay
//      without memory there).
//   7. ZeRO: the engine is built over every parameter, each with its block as its stage-3 unit
//      (stage 3's units are the blocks, and each forward segment a block with the blocks it
//      shares parameters with: the tied head reads the embedding's), frozen when LoRA froze it,
//      then the adapters. Every parameter gets its initial values from plan.initial_values (the
//      adapters from their own), at every stage: stages 0-2 fill their flat buffers and stage 3
//      only its shards. Its wrapper, the outermost, brackets every block's run with
//      Engine::pre_forward/post_forward (no-ops at stages 0-2; at stage 3 the block's units are
//      gathered before it runs and released after, and gathered again for its backward).
//
// The model must be built without memory (model::Materialize::kNo) or hold its values; after
// parallelize() its forwards (forward, loss_sum) train through the engine.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "comm/communicator.h"
#include "lora/lora_model.h"
#include "model/layer_graphs.h"
#include "model/model.h"
#include "train/sequence_parallel.h"
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
  // Pipeline parallelism: the blocks this rank trains (its stages', train/pipeline.h), in block
  // order; the engine holds their parameters alone, and the others stay without memory. Empty:
  // every block.
  std::vector<size_t> blocks;
  zero::EngineOptions engine;  // its stage picks the engine; initial_values is set here
  zero::OptimizerFactory optimizer;
  model::ValueSource initial_values;  // the model's parameters by name (files or a seeded init)
};

// Where the model runs: the whole world's communicator (ZeRO shards over all of it), the device,
// and the sequence-parallel groups cut from the world.
struct ParallelWorld {
  comm::Communicator& comm;
  torch::Device device;
  SequenceParallel& sequence_parallel;
};

// What parallelize() made of a model, owned together and taken apart in the one order that is safe
// (reset(), the destructor): the model's wrappers first (they refer to the engine and the
// graphs), then the engine (its hooks and buffers hold the parameters, the adapters' included),
// the graphs, the adapters (they leave the model's projections), and the model.
struct Parallelized {
  model::DecoderModel model{nullptr};
  std::unique_ptr<lora::LoraModel> lora;       // null without LoRA
  std::shared_ptr<model::LayerGraphs> graphs;  // null without plan.graph_recorder
  std::unique_ptr<zero::Engine> engine;

  Parallelized() = default;
  Parallelized(Parallelized&& other) noexcept = default;
  Parallelized& operator=(Parallelized&& other) noexcept;
  ~Parallelized() { reset(); }
  void reset() noexcept;
};

// Collective (the engine's construction). Keep `world` alive for as long as the result.
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
