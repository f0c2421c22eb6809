#pragma once
// The one place where the user's config becomes each component's own options. Pure functions.

#include <cstdint>

#include "config/config.h"
#include "data/datasets.h"
#include "data/loader.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "train/parallelize.h"
#include "train/pipeline.h"
#include "train/run_plan.h"
#include "zero/engine.h"

namespace dstrain::train {

data::DataOptions data_options(const config::Config& c);
data::LoaderOptions loader_options(const config::Config& c, int world_size, int rank);
zero::EngineOptions engine_options(const config::Config& c);
optim::LrScheduleOptions schedule_options(const config::Config& c, int64_t total_steps);
// The optimizer's state is allocated on `state_device` (where the master weights live).
zero::OptimizerFactory optimizer_factory(const config::Config& c,
                                         torch::Device state_device = torch::kCPU);
torch::ScalarType compute_dtype(const config::Config& c);
// The pipeline's schedule: parallel.pipeline_virtual_stages > 1 interleaves, else
// parallel.pipeline_schedule (gpipe, or 1F1B).
PipelineSchedule pipeline_schedule_of(const config::Config& c);
// What `run` chose (pipeline rank `stage`'s checkpointing, tiled MLP, the engine's options, the
// pipeline's stages, the CUDA graphs' budgets), the pipeline's schedule and the head's loss, and
// the optimizer (its state where the master weights live: the host when offloading them, else
// `device`). LoRA, the initial values, the graphs' recorder and the phase peaks are the caller's.
ParallelPlan parallel_plan(const config::Config& c, const RunPlan& run, torch::Device device,
                           int stage = 0);
// A Mixture-of-Experts model's router losses (model.router_aux_loss, model.router_aux_loss_coef,
// model.router_z_loss_coef) over what config.json says, and model.router_dtype, into `model.moe`.
// On a dense model a key set otherwise than its default warns that it has no effect.
void apply_router_options(const config::Config& c, model::ModelConfig& model);

}  // namespace dstrain::train
