#include "train/parallelize.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "model/activation_offload.h"
#include "model/layer_graphs.h"
#include "model/storage.h"
#include "train/expert_parallel.h"
#include "train/graphs_choice.h"

namespace dstrain::train {
namespace {

std::unique_ptr<lora::LoraModel> apply_lora(model::DecoderModel& model, const LoraPlan& plan) {
  for (auto& p : model->parameters()) p.set_requires_grad(false);
  auto lora = std::make_unique<lora::LoraModel>(model, plan.options, plan.key);
  if (!plan.load.empty()) lora->load(plan.load, plan.load_source);
  return lora;
}

// Parameters without memory stay without memory: only their device changes.
void place_on_device(model::DecoderModelImpl& model, lora::LoraModel* lora, torch::Device device) {
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (model::storage_bytes(p) == 0 && p.numel() > 0) {
      p.set_data(model::unmaterialized(p.sizes(), p.options().device(device)));
    } else {
      p.set_data(p.detach().to(device));
    }
  }
  if (!lora) return;
  for (auto& [name, t] : lora->named_parameters()) t.set_data(t.detach().to(device));
}

// The base's values, and the adapters' own for theirs (a module trained whole that was not
// loaded: its base weight's). Without a base source the engine reads every value from the
// parameters themselves, the adapters' included.
zero::InitialValues with_adapters(model::ValueSource base, const lora::LoraModel* lora) {
  if (!lora || !base) return base;
  auto adapters = std::make_shared<std::map<std::string, torch::Tensor>>();
  auto renamed = std::make_shared<std::map<std::string, std::string>>();
  for (const lora::LoraModel::BlockParameter& p : lora->block_parameters()) {
    if (!p.starts_from.empty()) {
      (*renamed)[p.name] = p.starts_from;
    } else {
      (*adapters)[p.name] = p.tensor.detach().clone().reshape({-1});
    }
  }
  return [base = std::move(base), adapters, renamed](const std::string& name, int64_t begin,
                                                     int64_t end) {
    if (const auto from = renamed->find(name); from != renamed->end()) {
      return base(from->second, begin, end);
    }
    const auto it = adapters->find(name);
    if (it == adapters->end()) return base(name, begin, end);
    return it->second.narrow(0, begin, end - begin);
  };
}

// Every block's run bracketed by the engine (no-ops but at stage 3).
model::BlockWrapper engine_wrapper(zero::Engine& engine) {
  return [&engine](const model::ModelBlock& block, const torch::Tensor& x,
                   const model::BlockContext&, const model::BlockFn& run) {
    engine.pre_forward(block.index);
    torch::Tensor out = run(x);
    // The head's fused loss sum is its output too: its gradient arriving starts its backward.
    engine.post_forward(block.index, out);
    return out;
  };
}

}  // namespace

std::vector<zero::NamedParameter> engine_parameters(const model::DecoderModelImpl& model,
                                                    const lora::LoraModel* lora,
                                                    const std::vector<size_t>& blocks) {
  const auto trains = [&blocks](size_t block) {
    return blocks.empty() || std::find(blocks.begin(), blocks.end(), block) != blocks.end();
  };
  std::vector<zero::NamedParameter> out;
  for (const auto& block : model.blocks()) {
    if (!trains(block->index)) continue;
    const int unit = static_cast<int>(block->index);
    for (const model::BlockParameter& p : block->parameters) {
      out.push_back({p.name, p.tensor, unit, /*frozen=*/!p.tensor.requires_grad(), p.placement});
    }
  }
  if (!lora) return out;
  for (const lora::LoraModel::BlockParameter& p : lora->block_parameters()) {
    if (!trains(p.block)) continue;
    out.push_back({p.name, p.tensor, static_cast<int>(p.block), /*frozen=*/false, p.placement});
  }
  return out;
}

std::vector<std::vector<int>> block_segments(const model::DecoderModelImpl& model) {
  std::vector<std::vector<int>> segments;
  for (const auto& block : model.blocks()) {
    std::vector<int> units{static_cast<int>(block->index)};
    for (size_t shared : block->shares) units.push_back(static_cast<int>(shared));
    segments.push_back(std::move(units));
  }
  return segments;
}

Parallelized& Parallelized::operator=(Parallelized&& other) noexcept {
  if (this == &other) return *this;
  reset();
  groups = std::move(other.groups);
  tensor_parallel = std::move(other.tensor_parallel);
  sequence_parallel = std::move(other.sequence_parallel);
  training_stream = std::move(other.training_stream);
  model = std::move(other.model);
  lora = std::move(other.lora);
  graphs = std::move(other.graphs);
  engine = std::move(other.engine);
  stage = std::move(other.stage);
  return *this;
}

void Parallelized::reset() noexcept {
  stage.reset();
  if (!model.is_empty()) model->unwrap_blocks();
  engine.reset();
  graphs.reset();
  lora.reset();
  model = model::DecoderModel(nullptr);
  training_stream.reset();
  sequence_parallel.reset();
  tensor_parallel.reset();
  groups.reset();
}

Parallelized parallelize(comm::Communicator& world, const layout::ParallelLayout& layout,
                         torch::Device device, const model::ModelConfig& config,
                         ParallelPlan plan) {
  auto groups = std::make_unique<ParallelGroups>(world, layout);
  auto tp = std::make_shared<TensorParallelGroup>(groups->tensor(), groups->slice_replicas(),
                                                  plan.tensor_sequence_parallel);
  auto sp = std::make_unique<SequenceParallel>(groups->sequence());
  std::shared_ptr<model::ExpertParallel> ep;
  if (groups->expert()) ep = std::make_shared<ExpertParallelGroup>(*groups->expert());
  model::DecoderModel model(config, model::Materialize::kNo, groups->tensor() ? tp : nullptr, ep);
  plan.initial_values = slice_source(std::move(plan.initial_values), *model, *tp);
  // Every placement is cut over the tensor-parallel group, but the experts' over the
  // expert-parallel one.
  plan.engine.model_parallel = {
      &world, [tensor = groups->tensor(), expert = groups->expert()](const model::Placement& p) {
        return p.group == model::PlacementGroup::kExpert ? expert : tensor;
      }};
  if (groups->expert()) {
    // The experts sharded over the ranks holding the same ones, their gradient the mean over the
    // stage's data- and sequence-parallel ranks as every other parameter's.
    const layout::ParallelLayout& l = groups->layout();
    const double scale = static_cast<double>(l.size(layout::Axis::kExpertData)) /
                         l.group_size(layout::kSliceReplicas);
    plan.engine.shard_group = [replicas = groups->expert_replicas(), scale](
                                  const model::Placement& p) -> zero::EngineOptions::ShardGroup {
      if (p.group != model::PlacementGroup::kExpert) return {};
      return {replicas, scale};
    };
  }
  // Before the engine exists: its gradient accumulators take the stream current then.
  auto stream = plan.graph_recorder ? std::make_unique<model::TrainingStream>(device) : nullptr;
  Parallelized out = parallelize(model, {groups->slice_replicas(), device, *sp, groups->pipeline()},
                                 std::move(plan));
  out.groups = std::move(groups);
  out.tensor_parallel = std::move(tp);
  out.sequence_parallel = std::move(sp);
  out.training_stream = std::move(stream);
  return out;
}

Parallelized parallelize(model::DecoderModel model, const ParallelWorld& world, ParallelPlan plan) {
  Parallelized out;
  out.model = model;
  if (plan.lora) out.lora = apply_lora(model, *plan.lora);
  world.sequence_parallel.apply(*model);
  model->set_tiled_mlp(plan.tiled_mlp);
  if (plan.loss_chunk_bytes > 0) model->set_loss_chunk_bytes(plan.loss_chunk_bytes);
  if (plan.graph_recorder) {
    const std::string blocker =
        layer_graphs_blocker(plan.checkpointing, plan.tiled_mlp, world.sequence_parallel.size());
    if (!blocker.empty()) fail(ErrorKind::kInternal, "parallelize: CUDA graphs, but {}", blocker);
    // First, so innermost: the graphs call the layer's own forward.
    model::LayerGraphOptions options;
    options.recompute_follows = plan.checkpointing != model::Checkpointing::kNone;
    options.pool_budget = plan.graph_pool_budget;
    options.min_speedup = plan.graph_min_speedup;
    out.graphs = std::make_shared<model::LayerGraphs>(std::move(plan.graph_recorder), options);
    model->wrap_blocks(model::WrapperSlot::kGraphs, out.graphs->wrapper());
    plan.engine.keep_gathered_memory = true;
  }
  switch (plan.checkpointing) {
    case model::Checkpointing::kNone:
      break;
    case model::Checkpointing::kSelective:
      model->wrap_blocks(model::WrapperSlot::kCheckpointing, model::selective_checkpoint_layers());
      break;
    case model::Checkpointing::kPlain:
      model->wrap_blocks(model::WrapperSlot::kCheckpointing, model::checkpoint_layers());
      break;
    case model::Checkpointing::kOffload:
      model->wrap_blocks(model::WrapperSlot::kCheckpointing,
                         model::checkpoint_layers(std::make_shared<model::ActivationOffload>()));
      break;
  }
  place_on_device(*model, out.lora.get(), world.device);
  // The blocks of this rank's stages (every block in a pipeline of one stage).
  StageRanges stages = plan.stages;
  if (stages.empty()) stages = {{0, model->blocks().size()}};
  const std::vector<size_t> blocks =
      world.pipeline ? rank_blocks(stages, world.pipeline->world_size(), world.pipeline->rank())
                     : std::vector<size_t>{};
  plan.engine.segments = block_segments(*model);
  plan.engine.initial_values = with_adapters(std::move(plan.initial_values), out.lora.get());
  out.engine = zero::make_engine(engine_parameters(*model, out.lora.get(), blocks), world.comm,
                                 plan.optimizer, std::move(plan.engine));
  model->wrap_blocks(model::WrapperSlot::kEngine, engine_wrapper(*out.engine));
  model->train();
  plan.stage.engine = out.engine.get();
  out.stage =
      std::make_unique<PipelineStage>(*model, world.pipeline, std::move(stages), plan.stage);
  return out;
}

}  // namespace dstrain::train
