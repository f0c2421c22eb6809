// Trainer: training.per_device_train_batch_size: auto (micro_batch_auto.h). The run plan makes the
// choice before the loader exists, from the memory model (run_plan.h); one trial step confirms it
// once the engine is built; the data order, the parameters, the optimizer and the random generators
// are those of a run that never tried.

#include <nlohmann/json.hpp>

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include "ckpt/manifest.h"
#include "comm/nccl_communicator.h"
#include "core/error.h"
#include "core/log.h"
#include "train/trainer.h"

namespace dstrain::train {

void Trainer::confirm_micro_batch() {
  if (!cfg_.training.micro_batch_auto || plan_.micro_batch_kept) return;
  const int64_t planned = plan_.micro_batch;
  for (int64_t micro : divisors_descending(samples_per_rank(cfg_.training))) {
    if (micro > planned) continue;
    if (trial_step_fits(micro)) {
      replan_micro_batch(plan_, micro);
      apply_micro_batch(cfg_.training, micro, plan_.data_parallel);
      return;
    }
    log::warn(
        "micro-batch auto: the trial step of micro-batch {} ran out of memory; trying the "
        "next smaller divisor",
        micro);
  }
  fail(ErrorKind::kRuntime,
       "training.per_device_train_batch_size: auto: even micro-batch 1 ran out of memory in its "
       "trial step");
}

// The trial: both micro-steps of a step of two on a batch of token 0 (every position counted),
// without a learning rate (nothing is updated during backward) and never followed by step():
// discard_micro_steps() drops their gradients. The first holds the activations; at stages 0-1
// without sequence parallelism it communicates nothing, so a rank can run out of memory alone and
// still meet the others at the vote. The last also reduces the gradients, with the buffers a real
// step's last micro-step holds; out of memory there (or in a micro-step that communicates) the
// others wait in a collective this rank left, so it is an error. Training's draws are keyed
// (train_step), so the trial's change nothing the steps draw.
bool Trainer::trial_step_fits(int64_t micro) {
  data::Batch b;
  b.input_ids = torch::zeros({micro, cfg_.data.max_length}, torch::kInt64);
  b.labels = torch::zeros({micro, cfg_.data.max_length}, torch::kInt64);
  b = on_device(std::move(b));
  if (const int P = size(layout::Axis::kPipeline); P > 1) {
    // A pipeline's trial is a step of P micro-batches through its stages (the first stage then
    // holds as many as a 1F1B step does): its transfers wait on the neighbours, so running out
    // of memory anywhere in it is an error.
    const std::vector<PipelineStage::MicroBatch> trial(static_cast<size_t>(P), stage_batch(b));
    parallel_.stage->sync_tied();  // the head's copy of a tied embedding, before it is read
    try {
      parallel_.stage->run(
          trial, [](const model::LossSum& head) { return head.sum * 0.0; },
          "training.per_device_train_batch_size");
    } catch (const c10::OutOfMemoryError& e) {
      fail(ErrorKind::kRuntime,
           "training.per_device_train_batch_size: auto: the trial step of micro-batch {} ran out "
           "of memory in the pipeline; set per_device_train_batch_size to a number below {}",
           micro, micro);
    }
    parallel_.engine->discard_micro_steps();
    return true;
  }
  const bool alone = cfg_.zero.stage <= 1 && size(layout::Axis::kSequence) == 1;
  // Whether micro-step `index` of 2 ran without running out of memory.
  auto micro_step = [&](int64_t index, bool may_fail) {
    try {
      const PipelineStage::MicroBatch mb = stage_batch(b);
      const torch::Tensor loss =
          parallel_.sequence_parallel
              ->reduce_loss(parallel_.model->loss_sum(mb.input_ids, mb.labels,
                                                      cfg_.model.fused_loss, mb.positions))
              .mean();
      parallel_.engine->backward(loss, {index, 2});
      return true;
    } catch (const c10::OutOfMemoryError& e) {
      if (may_fail) return false;
      fail(ErrorKind::kRuntime,
           "training.per_device_train_batch_size: auto: the trial step of micro-batch {} ran out "
           "of memory in its {} micro-step at ZeRO stage {}{}; set per_device_train_batch_size to "
           "a number below {}",
           micro, index == 0 ? "first" : "last (gradient reduction)", cfg_.zero.stage,
           size(layout::Axis::kSequence) > 1 ? " with sequence parallelism" : "", micro);
    }
  };
  // A trial's shape is recorded by no graph: its layers run eagerly, beside a block the size the
  // memory model gives the graphs' buffers and gradient buffers at this micro-batch (their pools'
  // activations are the eager ones, which the trial holds anyway). Not for graphs that `auto`
  // turned on: they take only the room the micro-batch leaves (graphs_choice.h).
  if (parallel_.graphs) parallel_.graphs->set_enabled(false);
  torch::Tensor graph_stand_in;
  bool fits = true;
  const bool stand_in = parallel_.graphs && plan_.graphs.min_speedup == 0;
  if (const int64_t bytes =
          stand_in ? plan_.memory->graphs(micro, plan_.checkpointing).graph_buffers : 0;
      bytes > 0) {
    try {
      graph_stand_in = torch::empty({bytes}, b.input_ids.options().dtype(torch::kByte));
    } catch (const c10::OutOfMemoryError&) {
      if (!alone) {
        fail(ErrorKind::kRuntime,
             "training.per_device_train_batch_size: auto: the trial step of micro-batch {} ran "
             "out of memory holding the {} MiB the CUDA graphs' buffers would take; set "
             "per_device_train_batch_size to a number below {} or training.cuda_graphs: off",
             micro, bytes >> 20, micro);
      }
      fits = false;
    }
  }
  fits = fits && micro_step(0, alone);
  if (alone) {
    std::vector<double> failed = {fits ? 0.0 : 1.0};
    all_reduce(failed);
    fits = failed[0] == 0;
  }
  if (fits) micro_step(1, false);
  parallel_.engine->discard_micro_steps();
  if (parallel_.graphs) parallel_.graphs->set_enabled(true);
  return fits;
}

int64_t Trainer::recorded_micro_batch() const {
  if (resume_from_.empty()) return 0;
  const ckpt::Manifest m = ckpt::read_manifest(resume_from_);
  const ckpt::ComponentRecord* progress = m.component("progress");
  if (progress == nullptr || !progress->state.contains("micro_batch_auto")) return 0;
  const nlohmann::json& r = progress->state.at("micro_batch_auto");
  const int64_t micro = r.value("micro", int64_t{0});
  const int64_t samples = samples_per_rank(cfg_.training);
  // Before the plan (which takes it as a fact): the data-parallel ranks from the config.
  const bool same_world =
      r.value("data_parallel", int64_t{0}) == cfg_.parallel.data_parallel(world_) &&
      r.value("samples", int64_t{0}) == samples;
  return same_world && micro > 0 && samples % micro == 0 ? micro : 0;
}

nlohmann::json Trainer::micro_batch_record() const {
  const config::TrainingSection& t = cfg_.training;
  if (!t.micro_batch_auto) return nullptr;
  return {{"micro", t.per_device_train_batch_size},
          {"samples", samples_per_rank(t)},
          {"data_parallel", size(layout::Axis::kData)}};
}

}  // namespace dstrain::train
