// Trainer: training.per_device_train_batch_size: auto (micro_batch_auto.h). The run plan makes the
// choice before the loader exists, from the memory model (run_plan.h); one trial step confirms it
// once the engine is built; the data order, the parameters, the optimizer and the random generators
// are those of a run that never tried.

#include <algorithm>

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

// The trial: a step of max(2, P) micro-batches of token 0 (every position counted) through the
// stage, which the pipeline's first stage holds as many of as a 1F1B step does, from a zero loss,
// without a learning rate (nothing is updated during backward) and never followed by step():
// discard_micro_steps() drops their gradients. On a stage of its own at ZeRO 0-1 without sequence
// parallelism the first micro-step communicates nothing, so it runs alone: a rank may run out of
// memory there and still meet the others at the vote before the last, which also reduces the
// gradients with the buffers a real step's last micro-step holds. Out of memory anywhere else the
// others wait in a collective this rank left (a transfer, a reduction), so it is an error.
// Training's draws are keyed (train_step), so the trial's change nothing the steps draw.
bool Trainer::trial_step_fits(int64_t micro) {
  data::Batch b;
  b.input_ids = torch::zeros({micro, cfg_.data.max_length}, torch::kInt64);
  b.labels = torch::zeros({micro, cfg_.data.max_length}, torch::kInt64);
  b = on_device(std::move(b));
  const int steps = std::max(2, size(layout::Axis::kPipeline));
  const std::vector<PipelineStage::MicroBatch> trial(static_cast<size_t>(steps), stage_batch(b));
  const bool alone = size(layout::Axis::kPipeline) == 1 && cfg_.zero.stage <= 1 &&
                     size(layout::Axis::kSequence) == 1;
  // Whether micro-steps [first, first + n) ran without running out of memory.
  auto run = [&](int first, int n, bool may_fail) {
    const std::vector<PipelineStage::MicroBatch> part(trial.begin() + first,
                                                      trial.begin() + first + n);
    try {
      parallel_.stage->run(
          part, [](const model::LossSum& head) { return head.sum * 0.0; },
          "training.per_device_train_batch_size", n == steps ? StepPart{} : StepPart{first, steps});
      return true;
    } catch (const c10::OutOfMemoryError& e) {
      if (may_fail) return false;
      fail(ErrorKind::kRuntime,
           "training.per_device_train_batch_size: auto: the trial step of micro-batch {} ran out "
           "of memory{} at ZeRO stage {}{}{}; set per_device_train_batch_size to a number below {}",
           micro, first + n == steps ? " (gradient reduction)" : "", cfg_.zero.stage,
           size(layout::Axis::kSequence) > 1 ? " with sequence parallelism" : "",
           size(layout::Axis::kPipeline) > 1 ? " in the pipeline" : "", micro);
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
  parallel_.stage->sync_tied();  // the head's copy of a tied embedding, before it is read
  if (alone) {
    fits = fits && run(0, 1, true);
    std::vector<double> failed = {fits ? 0.0 : 1.0};
    all_reduce(failed);
    fits = failed[0] == 0;
    if (fits) run(1, 1, false);
  } else {
    run(0, steps, false);
  }
  parallel_.engine->discard_micro_steps();
  parallel_.stage->take_expert_load();  // the trial's routing is no step's
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
