#include "train/component_options.h"

#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "launcher/stage_inputs.h"

namespace dstrain::train {

data::DataOptions data_options(const config::Config& c) {
  data::DataOptions o;
  o.train_path = c.data.train_path;
  o.eval_path = c.data.eval_path;
  o.format = c.data.format;
  o.text_field = c.data.text_field;
  o.prompt_field = c.data.prompt_field;
  o.completion_field = c.data.completion_field;
  o.document = c.data.document;
  o.max_length = c.data.max_length;
  o.packing = data::packing_from_word(c.data.packing);
  o.long_documents = data::long_documents_from_word(c.data.long_documents);
  o.add_bos = c.data.add_bos;
  o.eval_split = c.data.eval_split;
  o.seed = c.training.seed;
  o.cache_dir = launcher::shared_token_cache_dir(c);
  o.staged_cache_dir = launcher::staged_data_cache_dir();  // set by `launch --stage-dir`
  return o;
}

data::LoaderOptions loader_options(const config::Config& c, int world_size, int rank) {
  data::LoaderOptions o;
  o.micro_batch = c.training.per_device_train_batch_size;
  o.accum_steps = c.training.gradient_accumulation_steps;
  o.world_size = world_size;
  o.rank = rank;
  o.seed = c.training.seed;
  o.shuffle = c.data.shuffle;
  o.drop_last = c.data.drop_last;
  return o;
}

torch::ScalarType compute_dtype(const config::Config& c) {
  if (c.training.bf16) return torch::kBFloat16;
  if (c.training.fp16) return torch::kHalf;
  return torch::kFloat32;
}

// The config has checked the offload devices (none or cpu) and the stage each needs.
zero::EngineOptions engine_options(const config::Config& c) {
  zero::EngineOptions o;
  o.stage = c.zero.stage;
  o.reduce_bucket_size = c.zero.reduce_bucket_size;
  o.overlap_comm = c.zero.overlap_comm;
  o.contiguous_gradients = c.zero.contiguous_gradients;
  o.prefetch_bucket_size = c.zero.stage3_prefetch_bucket_size;
  o.param_persistence_threshold = c.zero.stage3_param_persistence_threshold;
  o.offload_optimizer = c.zero.offload_optimizer.device == "cpu";
  o.offload_param = c.zero.offload_param.device == "cpu";
  o.gradient_clipping = c.training.gradient_clipping;
  o.compute_dtype = compute_dtype(c);
  o.loss_scaling.initial_scale_power = static_cast<int>(c.training.fp16_initial_scale_power);
  o.loss_scaling.loss_scale_window = c.training.fp16_loss_scale_window;
  o.loss_scaling.hysteresis = static_cast<int>(c.training.fp16_hysteresis);
  o.loss_scaling.min_loss_scale = c.training.fp16_min_loss_scale;
  o.loss_scaling.static_scale = c.training.fp16_loss_scale;
  return o;
}

optim::LrScheduleOptions schedule_options(const config::Config& c, int64_t total_steps) {
  const auto& s = c.training.scheduler;
  optim::LrScheduleOptions o;
  o.type = s.type;
  o.warmup_ratio = s.warmup_ratio;
  if (s.warmup_steps >= 0) o.warmup_steps = s.warmup_steps;
  o.min_lr_ratio = s.min_lr_ratio;
  o.warmup_min_lr = s.warmup_min_lr;
  if (s.warmup_max_lr > 0) o.warmup_max_lr = s.warmup_max_lr;
  o.warmup_type = s.warmup_type;
  if (s.total_num_steps > 0) o.total_num_steps = s.total_num_steps;
  o.warmup_min_ratio = s.warmup_min_ratio;
  o.cos_min_ratio = s.cos_min_ratio;
  // DeepSpeed's warmup length: warmup_steps when given, else the ratio of the run, else its
  // default.
  if (s.warmup_steps >= 0) {
    o.warmup_num_steps = s.warmup_steps;
  } else if (s.warmup_ratio > 0) {
    o.warmup_num_steps =
        static_cast<int64_t>(std::ceil(s.warmup_ratio * static_cast<double>(total_steps)));
  }
  return o;
}

zero::OptimizerFactory optimizer_factory(const config::Config& c, torch::Device state_device) {
  const auto opt = c.training.optimizer;
  return [opt, state_device](int64_t numel, std::vector<optim::Range> no_decay) {
    if (opt.type == "sgd") {
      optim::SgdOptions o;
      o.momentum = opt.momentum;
      o.weight_decay = opt.weight_decay;
      o.no_decay = std::move(no_decay);
      return optim::make_sgd(numel, o, state_device);
    }
    optim::AdamWOptions o;
    o.beta1 = opt.beta1;
    o.beta2 = opt.beta2;
    o.eps = opt.eps;
    o.weight_decay = opt.weight_decay;
    o.no_decay = std::move(no_decay);
    return optim::make_adamw(numel, o, state_device);
  };
}

PipelineSchedule pipeline_schedule_of(const config::Config& c) {
  const config::ParallelSection& p = c.parallel;
  if (p.pipeline_virtual_stages > 1) return PipelineSchedule::kInterleaved;
  return p.pipeline_schedule == "gpipe" ? PipelineSchedule::kGpipe
                                        : PipelineSchedule::kOneForwardOneBackward;
}

ParallelPlan parallel_plan(const config::Config& c, const RunPlan& run, torch::Device device,
                           int stage) {
  ParallelPlan plan;
  plan.tiled_mlp = run.tiled_mlp;
  plan.checkpointing = run.checkpointing_of(stage);
  plan.graph_pool_budget = run.graph_pool_budget;
  plan.graph_min_speedup = run.graphs.min_speedup;
  plan.loss_chunk_bytes = c.model.fused_loss_chunk_mb > 0 ? c.model.fused_loss_chunk_mb << 20 : 0;
  plan.stages = run.stages;
  plan.stage.schedule = pipeline_schedule_of(c);
  plan.stage.fused_loss = c.model.fused_loss;
  plan.tensor_sequence_parallel = c.parallel.tensor_sequence_parallel;
  plan.engine = run.engine;
  const bool host_state = c.zero.offload_optimizer.device == "cpu";
  plan.optimizer = optimizer_factory(c, host_state ? torch::Device(torch::kCPU) : device);
  return plan;
}

void apply_router_options(const config::Config& c, model::ModelConfig& model) {
  const config::ModelSection& m = c.model;
  const std::string aux = m.router_aux_loss;
  if (model.moe.experts == 0) {
    if (aux != "auto" || m.router_aux_loss_coef >= 0 || m.router_z_loss_coef > 0 ||
        m.router_dtype != "auto") {
      log::warn(
          "{}: model.router_aux_loss, router_aux_loss_coef, router_z_loss_coef and router_dtype "
          "have no effect: {} is not a Mixture-of-Experts model",
          c.source_path, model.model_type);
    }
    return;
  }
  model.moe.float32_router = m.router_dtype == "float32";
  if (model.moe.float32_router && compute_dtype(c) == torch::kFloat) {
    log::warn("{}: model.router_dtype: float32 has no effect: the run computes in float32",
              c.source_path);
  }
  model::MoeConfig& moe = model.moe;
  if (aux != "auto") moe.aux_loss = aux == "true";
  if (m.router_aux_loss_coef >= 0) moe.aux_loss_coef = m.router_aux_loss_coef;
  moe.z_loss_coef = m.router_z_loss_coef;
  if (!moe.aux_loss && m.router_aux_loss_coef >= 0) {
    log::warn("{}: model.router_aux_loss_coef has no effect: the load-balancing loss is off",
              c.source_path);
  }
}

}  // namespace dstrain::train
