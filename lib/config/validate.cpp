#include "config/validate.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dstrain::config::detail {
namespace {

// Where a setting came from; a setting left at its default is attributed to the config file.
Origin origin_of(const Merger& merger, const std::string& field_path, const std::string& file) {
  if (const Assigned* a = merger.find(field_path)) return a->origin;
  return Origin{file, field_path, false};
}

std::string describe_origin(const Merger& merger, const std::string& field_path) {
  const Assigned* a = merger.find(field_path);
  return a == nullptr ? fmt::format("{} (default)", field_path)
                      : fmt::format("{} at {}", a->origin.key, a->origin.where);
}

// `world`: the data-parallel degree of the world's ranks under `p`.
std::string world_term(int world, const ParallelSection& p) {
  const int64_t sp = p.sequence_parallel_size, tp = p.tensor_parallel_size,
                pp = p.pipeline_parallel_size;
  if (sp == 1 && tp == 1 && pp == 1) return fmt::format("world size ({})", world);
  std::string by;
  if (pp > 1) by += fmt::format(" / pipeline_parallel_size {}", pp);
  if (sp > 1) by += fmt::format(" / sequence_parallel_size {}", sp);
  if (tp > 1) by += fmt::format(" / tensor_parallel_size {}", tp);
  return fmt::format("data-parallel size ({} = world size {}{})", world, world * sp * tp * pp, by);
}

// per_device_train_batch_size: auto. The samples each data-parallel rank takes per step: the
// global batch over the ranks when train_batch_size is given, else the user's own split, the
// number auto replaced (a DeepSpeed section's train_micro_batch_size_per_gpu; 1 when none) times
// the accumulation. The config then holds micro-batch 1 × those samples; the trainer picks a
// divisor of them, so the global batch stays exact.
void resolve_auto_batch(TrainingSection& t, const Merger& merger, const std::string& file,
                        int world, const ParallelSection& sp) {
  const Assigned* split = merger.micro_batch_under_auto();
  const int64_t split_micro = split ? std::get<int64_t>(split->value) : 1;
  int64_t samples = split_micro * t.gradient_accumulation_steps;
  if (t.train_batch_size != -1) {
    const Origin at = origin_of(merger, "training.train_batch_size", file);
    if (t.train_batch_size % world != 0) {
      fail_at(at, fmt::format("{} is not divisible by {}: per_device_train_batch_size: auto ({}) "
                              "needs a whole number of samples per rank",
                              t.train_batch_size, world_term(world, sp),
                              describe_origin(merger, "training.per_device_train_batch_size")));
    }
    const bool accum_given = merger.find("training.gradient_accumulation_steps") != nullptr;
    if (split != nullptr && accum_given && samples * world != t.train_batch_size) {
      fail_at(at,
              fmt::format("{} != {} ({}) * gradient_accumulation_steps ({}) * {} = {}",
                          t.train_batch_size, split->origin.key, split_micro,
                          t.gradient_accumulation_steps, world_term(world, sp), samples * world));
    }
    samples = t.train_batch_size / world;
  }
  t.per_device_train_batch_size = 1;
  t.gradient_accumulation_steps = samples;
}

// DeepSpeed's rule: train_batch_size = micro * accumulation * world; any two given determine the
// third. "Given" means written somewhere (our section, DeepSpeed keys or --set), not defaulted.
// `world` is the data-parallel degree: the world size over sequence_parallel_size and
// tensor_parallel_size (`sp`).
void resolve_batch(TrainingSection& t, const Merger& merger, const std::string& file, int world,
                   const ParallelSection& sp) {
  if (t.micro_batch_auto) {
    resolve_auto_batch(t, merger, file, world, sp);
    return;
  }
  if (t.train_batch_size == -1) return;
  const Origin at = origin_of(merger, "training.train_batch_size", file);
  const bool micro_given = merger.find("training.per_device_train_batch_size") != nullptr;
  const bool accum_given = merger.find("training.gradient_accumulation_steps") != nullptr;
  const int64_t tbs = t.train_batch_size;
  auto derive = [&](int64_t divisor, const std::string& terms) {
    if (tbs % divisor != 0) {
      fail_at(at, fmt::format("{} is not divisible by {} = {}", tbs, terms, divisor));
    }
    return tbs / divisor;
  };
  const std::string world_words = world_term(world, sp);
  if (micro_given && !accum_given) {
    t.gradient_accumulation_steps = derive(t.per_device_train_batch_size * world,
                                           fmt::format("per_device_train_batch_size ({}) * {}",
                                                       t.per_device_train_batch_size, world_words));
  } else if (!micro_given && accum_given) {
    t.per_device_train_batch_size = derive(t.gradient_accumulation_steps * world,
                                           fmt::format("gradient_accumulation_steps ({}) * {}",
                                                       t.gradient_accumulation_steps, world_words));
  } else if (!micro_given && !accum_given) {
    t.gradient_accumulation_steps = 1;
    t.per_device_train_batch_size = derive(world, world_words);
  }
  const int64_t product = t.per_device_train_batch_size * t.gradient_accumulation_steps * world;
  if (product != tbs) {
    fail_at(at, fmt::format("{} != per_device_train_batch_size ({}) * gradient_accumulation_steps "
                            "({}) * {} = {}",
                            tbs, t.per_device_train_batch_size, t.gradient_accumulation_steps,
                            world_words, product));
  }
}

// World = data-parallel degree × P; every rank of a sequence-parallel group keeps max_length / P
// tokens of each sequence.
void check_parallel(const Config& c, const Merger& m, const std::string& file, int world) {
  const int64_t p = c.parallel.sequence_parallel_size, t = c.parallel.tensor_parallel_size;
  if (world % p != 0) {
    fail_at(origin_of(m, "parallel.sequence_parallel_size", file),
            fmt::format("the world size ({}) is not divisible by sequence_parallel_size ({}): "
                        "world = data-parallel degree x sequence_parallel_size",
                        world, p));
  }
  if (c.data.max_length % p != 0) {
    fail_at(origin_of(m, "parallel.sequence_parallel_size", file),
            fmt::format("data.max_length ({}, {}) is not divisible by sequence_parallel_size ({}): "
                        "each rank of a sequence-parallel group keeps max_length / {} tokens",
                        c.data.max_length, describe_origin(m, "data.max_length"), p, p));
  }
  if (world % (p * t) != 0) {
    fail_at(origin_of(m, "parallel.tensor_parallel_size", file),
            fmt::format("the world size ({}) is not divisible by sequence_parallel_size ({}) x "
                        "tensor_parallel_size ({}): world = data-parallel degree x "
                        "sequence_parallel_size x tensor_parallel_size",
                        world, p, t));
  }
}

// Expert parallelism: E_p ranks of each stage share each MoE layer's experts (whether the model
// has experts, and E_p divides them, is checked against the model).
void check_expert_parallel(const Config& c, const Merger& m, const std::string& file, int world) {
  const ParallelSection& p = c.parallel;
  const int64_t ep = p.expert_parallel_size;
  const int64_t stage = world / p.pipeline_parallel_size;
  if (ep > 1 && stage % ep != 0) {
    fail_at(
        origin_of(m, "parallel.expert_parallel_size", file),
        fmt::format("a pipeline stage's {} ranks (world {} / pipeline_parallel_size {}) are not "
                    "divisible by expert_parallel_size ({}): a Mixture-of-Experts layer's "
                    "experts are spread over expert_parallel_size of a stage's ranks",
                    stage, world, p.pipeline_parallel_size, ep));
  }
  if (ep > 1 && p.tensor_parallel_size > 1) {
    fail_at(origin_of(m, "parallel.expert_parallel_size", file),
            fmt::format("expert_parallel_size ({}) with tensor_parallel_size ({}): a "
                        "Mixture-of-Experts model does not run tensor-parallel yet; use the ranks "
                        "for expert and data parallelism",
                        ep, p.tensor_parallel_size));
  }
}

// Pipeline parallelism: P stages, each on world / P ranks; what the pipeline does not run with.
void check_pipeline(const Config& c, const Merger& m, const std::string& file, int world) {
  const ParallelSection& p = c.parallel;
  const int64_t pp = p.pipeline_parallel_size, v = p.pipeline_virtual_stages;
  const Origin at = origin_of(m, "parallel.pipeline_parallel_size", file);
  if (world % (pp * p.sequence_parallel_size * p.tensor_parallel_size) != 0) {
    fail_at(at, fmt::format("the world size ({}) is not divisible by pipeline_parallel_size ({}) x "
                            "sequence_parallel_size ({}) x tensor_parallel_size ({}): world = "
                            "pipeline stages x data-parallel degree x sequence_parallel_size x "
                            "tensor_parallel_size",
                            world, pp, p.sequence_parallel_size, p.tensor_parallel_size));
  }
  const bool interleaved = p.pipeline_schedule == "interleaved_1f1b";
  if (v > 1 && p.pipeline_schedule == "gpipe") {
    fail_at(origin_of(m, "parallel.pipeline_virtual_stages", file),
            fmt::format("{} virtual stages per rank run only the 1F1B schedule (interleaved), but "
                        "the schedule is gpipe ({})",
                        v, describe_origin(m, "parallel.pipeline_schedule")));
  }
  if (interleaved && v < 2) {
    fail_at(origin_of(m, "parallel.pipeline_schedule", file),
            "interleaved_1f1b needs parallel.pipeline_virtual_stages of 2 or more (the stages "
            "each rank holds)");
  }
  if (!p.pipeline_split.empty() && static_cast<int64_t>(p.pipeline_split.size()) != pp * v) {
    fail_at(origin_of(m, "parallel.pipeline_split", file),
            fmt::format("{} layer counts for {} stage(s) (pipeline_parallel_size {} x "
                        "pipeline_virtual_stages {})",
                        p.pipeline_split.size(), pp * v, pp, v));
  }
  if (pp == 1) return;
  if (c.zero.stage == 3) {
    fail_at(at, fmt::format("pipeline parallelism runs with ZeRO stage 0, 1 or 2, not 3 ({}): "
                            "stage 3 would gather every stage's parameters again for each of "
                            "the step's micro-batches (DeepSpeed's pipeline engine refuses it "
                            "too); use stage 1, or 2",
                            describe_origin(m, "zero.stage")));
  }
  if (c.training.micro_batch_auto && v > 1) {
    fail_at(origin_of(m, "training.per_device_train_batch_size", file),
            "auto is not available with the interleaved pipeline schedule "
            "(parallel.pipeline_virtual_stages > 1), whose micro-batches must be a multiple of "
            "the stages: give the micro-batch, and the accumulation steps that are the "
            "pipeline's micro-batches");
  }
}

// The pipeline's micro-batches are the step's accumulation steps: interleaving takes them P at a
// time (Megatron-LM's rule); fewer than the stages leave most of each step idle.
void check_pipeline_batch(const Config& c, const Merger& m, const std::string& file) {
  const ParallelSection& p = c.parallel;
  const int64_t pp = p.pipeline_parallel_size, v = p.pipeline_virtual_stages;
  const int64_t micro = c.training.gradient_accumulation_steps;
  if (pp == 1) return;
  if (v > 1 && micro % pp != 0) {
    fail_at(origin_of(m, "training.gradient_accumulation_steps", file),
            fmt::format("{} is not a multiple of pipeline_parallel_size ({}): interleaved 1F1B "
                        "({} virtual stages per rank) takes the micro-batches {} at a time",
                        micro, pp, v, pp));
  }
  if (micro < pp) {
    const double idle = static_cast<double>(pp - 1) / static_cast<double>(v * micro + pp - 1);
    const Assigned* a = m.find("training.gradient_accumulation_steps");
    m.warn(
        fmt::format("{}: {} micro-batch(es) per step through {} pipeline stages: each rank "
                    "idles {:.0f}% of a step; gradient_accumulation_steps of {} or more keep "
                    "the stages busier",
                    a ? a->origin.where : file, micro, pp, 100 * idle, 4 * pp));
  }
}

void require(const std::string& value, const Merger& merger, const std::string& field_path,
             const std::string& file, const char* what) {
  if (!value.empty()) return;
  fail_at(origin_of(merger, field_path, file), fmt::format("required: expected {}", what));
}

void check_precision_and_optimizer(const Config& c, const Merger& m, const std::string& file) {
  const TrainingSection& t = c.training;
  if (t.bf16 && t.fp16) {
    fail_at(origin_of(m, "training.fp16", file),
            fmt::format("fp16 and bf16 cannot both be enabled (bf16 is set by {})",
                        describe_origin(m, "training.bf16")));
  }
  if (t.optimizer.momentum > 0 && t.optimizer.type != "sgd") {
    fail_at(origin_of(m, "training.momentum", file),
            fmt::format("momentum applies to the sgd optimizer only, but the optimizer is {} ({})",
                        t.optimizer.type, describe_origin(m, "training.optimizer")));
  }
  const SchedulerSection& s = t.scheduler;
  if (s.warmup_max_lr > 0 && s.warmup_min_lr > s.warmup_max_lr) {
    fail_at(origin_of(m, "training.warmup_min_lr", file),
            fmt::format("warmup_min_lr ({}) is above warmup_max_lr ({})", s.warmup_min_lr,
                        s.warmup_max_lr));
  }
}

// lr_scheduler: constant is a flat rate (the Hugging Face Trainer's constant schedule): a warmup
// key set beside it acts on nothing; constant_with_warmup is the one that warms up.
void warn_unused_warmup(const Config& c, const Merger& m) {
  if (c.training.scheduler.type != "constant") return;
  for (const char* key : {"training.warmup_ratio", "training.warmup_steps"}) {
    if (const Assigned* a = m.find(key)) {
      m.warn(
          fmt::format("{}: {}: accepted, no effect: lr_scheduler constant has no warmup "
                      "(constant_with_warmup has one)",
                      a->origin.where, a->origin.key));
    }
  }
}

void check_zero(const ZeroSection& z, const Merger& m, const std::string& file) {
  if (z.offload_optimizer.device != "none" && z.stage < 1) {
    fail_at(origin_of(m, "zero.offload_optimizer.device", file),
            fmt::format("offloading the optimizer needs ZeRO stage 1, 2 or 3, but the stage is {} "
                        "({})",
                        z.stage, describe_origin(m, "zero.stage")));
  }
  if (z.offload_param.device != "none" && z.stage != 3) {
    fail_at(origin_of(m, "zero.offload_param.device", file),
            fmt::format("offloading parameters needs ZeRO stage 3, but the stage is {} ({})",
                        z.stage, describe_origin(m, "zero.stage")));
  }
}

void check_lora(const LoraSection& l, const Merger& m, const std::string& file) {
  if (l.enabled && l.bias != "none") {
    fail_at(origin_of(m, "lora.bias", file),
            fmt::format("'{}' is not supported; only none (biases stay frozen, PEFT's default)",
                        l.bias));
  }
}

void check_data(const DataSection& d, const Merger& m, const std::string& file) {
  require(d.train_path, m, "data.train_path", file, "the training data path");
  if (d.eval_split > 0 && !d.eval_path.empty()) {
    fail_at(origin_of(m, "data.eval_split", file),
            fmt::format("eval_split carves evaluation data from train_path, but an evaluation set "
                        "is already given ({}); set only one",
                        describe_origin(m, "data.eval_path")));
  }
}

}  // namespace

void resolve_and_validate(Config& config, const Merger& merger, const std::string& file,
                          int world_size) {
  if (world_size < 1) fail(ErrorKind::kConfig, "world size must be at least 1, got {}", world_size);
  require(config.model.name_or_path, merger, "model.name_or_path", file,
          "a model directory or a Hugging Face hub id");
  require(config.model.revision, merger, "model.revision", file,
          "a branch, tag or commit of the hub repo (default main)");
  check_data(config.data, merger, file);
  check_parallel(config, merger, file, world_size);
  check_pipeline(config, merger, file, world_size);
  check_expert_parallel(config, merger, file, world_size);
  // The batch is counted over data-parallel ranks: a sequence- or tensor-parallel group reads one
  // sample.
  resolve_batch(config.training, merger, file,
                static_cast<int>(config.parallel.data_parallel(world_size)), config.parallel);
  check_pipeline_batch(config, merger, file);
  check_precision_and_optimizer(config, merger, file);
  warn_unused_warmup(config, merger);
  check_zero(config.zero, merger, file);
  check_lora(config.lora, merger, file);
}

}  // namespace dstrain::config::detail
