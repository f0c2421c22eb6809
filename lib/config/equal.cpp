// Equality of settings, member by member (written out so that a new member is a visible edit here).

#include <tuple>

#include "config/config.h"

namespace dstrain::config {

bool operator==(const ModelSection& a, const ModelSection& b) {
  auto t = [](const ModelSection& s) {
    return std::tie(s.name_or_path, s.revision, s.init, s.dtype, s.tokenizer, s.use_flash_attn,
                    s.gradient_checkpointing, s.tiled_mlp, s.fused_loss, s.fused_loss_chunk_mb,
                    s.router_aux_loss, s.router_aux_loss_coef, s.router_z_loss_coef,
                    s.router_dtype);
  };
  return t(a) == t(b);
}

bool operator==(const DataSection& a, const DataSection& b) {
  auto t = [](const DataSection& s) {
    return std::tie(s.train_path, s.eval_path, s.format, s.text_field, s.prompt_field,
                    s.completion_field, s.document, s.max_length, s.packing, s.long_documents,
                    s.add_bos, s.eval_split, s.shuffle, s.drop_last, s.num_workers,
                    s.num_workers_eval, s.stage_dir);
  };
  return t(a) == t(b);
}

bool operator==(const OptimizerSection& a, const OptimizerSection& b) {
  auto t = [](const OptimizerSection& s) {
    return std::tie(s.type, s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.momentum);
  };
  return t(a) == t(b);
}

bool operator==(const SchedulerSection& a, const SchedulerSection& b) {
  auto t = [](const SchedulerSection& s) {
    return std::tie(s.type, s.warmup_ratio, s.warmup_steps, s.min_lr_ratio, s.warmup_min_lr,
                    s.warmup_max_lr, s.warmup_type, s.total_num_steps, s.warmup_min_ratio,
                    s.cos_min_ratio);
  };
  return t(a) == t(b);
}

bool operator==(const TrainingSection& a, const TrainingSection& b) {
  auto t = [](const TrainingSection& s) {
    return std::tie(s.epochs, s.max_steps, s.per_device_train_batch_size, s.micro_batch_auto,
                    s.micro_batch_chosen, s.per_device_eval_batch_size,
                    s.gradient_accumulation_steps, s.train_batch_size, s.optimizer, s.scheduler,
                    s.seed, s.bf16, s.fp16, s.fp16_loss_scale, s.fp16_initial_scale_power,
                    s.fp16_loss_scale_window, s.fp16_min_loss_scale, s.fp16_hysteresis,
                    s.gradient_clipping, s.loss_normalization, s.eval_interval, s.eval_max_batches,
                    s.log_interval, s.cuda_graphs);
  };
  return t(a) == t(b);
}

bool operator==(const LoraSection& a, const LoraSection& b) {
  auto t = [](const LoraSection& s) {
    return std::tie(s.enabled, s.r, s.alpha, s.dropout, s.target_modules, s.target_parameters,
                    s.modules_to_save, s.bias, s.use_rslora, s.init, s.init_from);
  };
  return t(a) == t(b);
}

bool operator==(const OffloadSection& a, const OffloadSection& b) {
  return a.device == b.device && a.pin_memory == b.pin_memory;
}

bool operator==(const ZeroSection& a, const ZeroSection& b) {
  // `config` is provenance (which JSON was merged), not a setting.
  auto t = [](const ZeroSection& s) {
    return std::tie(s.stage, s.offload_optimizer, s.offload_param, s.overlap_comm,
                    s.contiguous_gradients, s.reduce_bucket_size, s.allgather_bucket_size,
                    s.stage3_prefetch_bucket_size, s.stage3_param_persistence_threshold,
                    s.stage3_max_live_parameters, s.stage3_max_reuse_distance,
                    s.stage3_gather_16bit_weights_on_model_save);
  };
  return t(a) == t(b);
}

bool operator==(const MlflowSection& a, const MlflowSection& b) {
  return a.tracking_uri == b.tracking_uri && a.parent_run_id == b.parent_run_id;
}

bool operator==(const LoggingSection& a, const LoggingSection& b) {
  auto t = [](const LoggingSection& s) {
    return std::tie(s.out_dir, s.metrics_path, s.progress, s.wall_clock_breakdown, s.trace,
                    s.profile_steps, s.tensorboard, s.tensorboard_dir, s.mlflow_experiment,
                    s.mlflow);
  };
  return t(a) == t(b);
}

bool operator==(const CheckpointSection& a, const CheckpointSection& b) {
  auto t = [](const CheckpointSection& s) {
    return std::tie(s.dir, s.interval, s.keep_last, s.save_final, s.async, s.on_error,
                    s.max_writers_per_node);
  };
  return t(a) == t(b);
}

bool operator==(const ParallelSection& a, const ParallelSection& b) {
  auto t = [](const ParallelSection& s) {
    return std::tie(s.sequence_parallel_size, s.tensor_parallel_size, s.tensor_sequence_parallel,
                    s.tensor_parallel_across_nodes, s.pipeline_parallel_size, s.pipeline_schedule,
                    s.pipeline_virtual_stages, s.pipeline_split, s.expert_parallel_size);
  };
  return t(a) == t(b);
}

bool operator==(const Config& a, const Config& b) {
  return a.model == b.model && a.data == b.data && a.training == b.training && a.lora == b.lora &&
         a.zero == b.zero && a.parallel == b.parallel && a.logging == b.logging &&
         a.checkpoint == b.checkpoint;
}

}  // namespace dstrain::config
