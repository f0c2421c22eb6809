// The config → component options mapping (train/component_options.h): every key lands in the field
// its component reads, and the derived values (compute dtype, offload flags, DeepSpeed's warmup
// length, the optimizer chosen) follow the config.

#include "train/component_options.h"

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "config/config.h"

namespace dstrain::train {
namespace {

config::Config load(const std::string& extra) {
  return config::load_config_from_string(
      "model:\n  name_or_path: tiny\ndata:\n  train_path: train.txt\n" + extra, "train.yaml");
}

TEST(ComponentOptions, DataOptionsCarryTheDataSectionTheSeedAndTheCacheDir) {
  const config::Config c = load(
      "data:\n  eval_path: b.parquet\n  format: parquet\n"
      "  text_field: body\n  document: file\n  max_length: 77\n  packing: false\n  add_bos: true\n"
      "  eval_split: 0\ntraining:\n  seed: 99\nlogging:\n  out_dir: /runs/x\n");
  const data::DataOptions o = data_options(c);
  EXPECT_EQ(o.train_path, "train.txt");
  EXPECT_EQ(o.eval_path, "b.parquet");
  EXPECT_EQ(o.format, "parquet");
  EXPECT_EQ(o.text_field, "body");
  EXPECT_EQ(o.document, "file");
  EXPECT_EQ(o.max_length, 77);
  EXPECT_EQ(o.packing, data::Packing::kPad);
  EXPECT_EQ(o.add_bos, "true");
  EXPECT_EQ(o.eval_split, 0.0);
  EXPECT_EQ(o.seed, 99u);
  EXPECT_EQ(o.cache_dir, "/runs/x/data_cache");
}

TEST(ComponentOptions, LoaderOptionsTakeTheBatchShapeAndThisRank) {
  const config::Config c = load(
      "data:\n  shuffle: false\n  drop_last: true\ntraining:\n  per_device_train_batch_size: 3\n"
      "  gradient_accumulation_steps: 5\n  seed: 11\n");
  const data::LoaderOptions o = loader_options(c, 4, 2);
  EXPECT_EQ(o.micro_batch, 3);
  EXPECT_EQ(o.accum_steps, 5);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.rank, 2);
  EXPECT_EQ(o.seed, 11u);
  EXPECT_FALSE(o.shuffle);
  EXPECT_TRUE(o.drop_last);
}

// The run plan's choices, the pipeline's schedule and the head's loss from the config.
TEST(ComponentOptions, ParallelPlanTakesTheRunPlansChoices) {
  RunPlan run;
  run.checkpointing = model::Checkpointing::kSelective;
  run.tiled_mlp = 64;
  run.stages = {{0, 2}, {2, 6}};
  run.graph_pool_budget = 1234;
  run.engine.stage = 2;
  const config::Config c = load(
      "model:\n  fused_loss: false\n  fused_loss_chunk_mb: 3\n"
      "parallel:\n  pipeline_schedule: gpipe\n");
  const ParallelPlan plan = parallel_plan(c, run, torch::kCPU);
  EXPECT_EQ(plan.checkpointing, model::Checkpointing::kSelective);
  EXPECT_EQ(plan.tiled_mlp, 64);
  EXPECT_EQ(plan.stages, run.stages);
  EXPECT_EQ(plan.graph_pool_budget, 1234);
  EXPECT_EQ(plan.engine.stage, 2);
  EXPECT_EQ(plan.loss_chunk_bytes, 3 << 20);
  EXPECT_EQ(plan.stage.schedule, PipelineSchedule::kGpipe);
  EXPECT_FALSE(plan.stage.fused_loss);
  EXPECT_TRUE(plan.optimizer);
}

TEST(ComponentOptions, ComputeDtypeFollowsBf16AndFp16) {
  EXPECT_EQ(compute_dtype(load("")), torch::kFloat32);
  EXPECT_EQ(compute_dtype(load("training:\n  bf16: true\n")), torch::kBFloat16);
  EXPECT_EQ(compute_dtype(load("training:\n  fp16: true\n")), torch::kHalf);
}

TEST(ComponentOptions, EngineOptionsTakeTheZeroSectionClippingAndLossScaling) {
  const config::Config c = load(
      "zero:\n  stage: 3\n  reduce_bucket_size: 1234\n  overlap_comm: false\n"
      "  contiguous_gradients: false\n  stage3_prefetch_bucket_size: 555\n"
      "  stage3_param_persistence_threshold: 66\n  offload_optimizer: {device: cpu}\n"
      "  offload_param: {device: cpu}\n"
      "training:\n  gradient_clipping: 0.7\n  fp16: true\n  fp16_initial_scale_power: 12\n"
      "  fp16_loss_scale_window: 50\n  fp16_hysteresis: 3\n  fp16_min_loss_scale: 0.5\n");
  const zero::EngineOptions o = engine_options(c);
  EXPECT_EQ(o.stage, 3);
  EXPECT_EQ(o.reduce_bucket_size, 1234);
  EXPECT_FALSE(o.overlap_comm);
  EXPECT_FALSE(o.contiguous_gradients);
  EXPECT_EQ(o.prefetch_bucket_size, 555);
  EXPECT_EQ(o.param_persistence_threshold, 66);
  EXPECT_TRUE(o.offload_optimizer);
  EXPECT_TRUE(o.offload_param);
  EXPECT_DOUBLE_EQ(o.gradient_clipping, 0.7);
  EXPECT_EQ(o.compute_dtype, torch::kHalf);
  EXPECT_EQ(o.loss_scaling.initial_scale_power, 12);
  EXPECT_EQ(o.loss_scaling.loss_scale_window, 50);
  EXPECT_EQ(o.loss_scaling.hysteresis, 3);
  EXPECT_DOUBLE_EQ(o.loss_scaling.min_loss_scale, 0.5);
  EXPECT_DOUBLE_EQ(o.loss_scaling.static_scale, 0.0);  // dynamic unless fp16_loss_scale > 0
}

TEST(ComponentOptions, EngineOffloadIsOffWithoutACpuDevice) {
  const zero::EngineOptions o = engine_options(load("zero:\n  stage: 2\n"));
  EXPECT_FALSE(o.offload_optimizer);
  EXPECT_FALSE(o.offload_param);
  EXPECT_EQ(o.compute_dtype, torch::kFloat32);
}

TEST(ComponentOptions, ScheduleWarmupStepsWinAndSetDeepSpeedsWarmupLength) {
  const optim::LrScheduleOptions o = schedule_options(
      load("training:\n  lr_scheduler: WarmupDecayLR\n  warmup_steps: 7\n  warmup_ratio: 0.5\n"
           "  warmup_min_lr: 0.001\n  warmup_max_lr: 0.01\n  warmup_type: linear\n"
           "  total_num_steps: 300\n"),
      200);
  EXPECT_EQ(o.type, "WarmupDecayLR");
  ASSERT_TRUE(o.warmup_steps.has_value());
  EXPECT_EQ(*o.warmup_steps, 7);
  EXPECT_EQ(o.warmup_num_steps, 7);
  EXPECT_DOUBLE_EQ(o.warmup_min_lr, 0.001);
  ASSERT_TRUE(o.warmup_max_lr.has_value());
  EXPECT_DOUBLE_EQ(*o.warmup_max_lr, 0.01);
  EXPECT_EQ(o.warmup_type, "linear");
  ASSERT_TRUE(o.total_num_steps.has_value());
  EXPECT_EQ(*o.total_num_steps, 300);
}

TEST(ComponentOptions, ScheduleWarmupRatioRoundsUpOverTheRun) {
  const optim::LrScheduleOptions o = schedule_options(
      load("training:\n  lr_scheduler: cosine\n  warmup_ratio: 0.1\n  min_lr_ratio: 0.2\n"), 95);
  EXPECT_EQ(o.type, "cosine");
  EXPECT_FALSE(o.warmup_steps.has_value());
  EXPECT_DOUBLE_EQ(o.warmup_ratio, 0.1);
  EXPECT_DOUBLE_EQ(o.min_lr_ratio, 0.2);
  EXPECT_EQ(o.warmup_num_steps, 10);  // ceil(9.5)
}

TEST(ComponentOptions, ScheduleWithoutWarmupKeepsDeepSpeedDefaults) {
  const optim::LrScheduleOptions o =
      schedule_options(load("training:\n  lr_scheduler: WarmupCosineLR\n  warmup_min_ratio: 0.05\n"
                            "  cos_min_ratio: 0.01\n"),
                       100);
  EXPECT_EQ(o.warmup_num_steps, optim::LrScheduleOptions().warmup_num_steps);
  EXPECT_FALSE(o.warmup_max_lr.has_value());
  EXPECT_FALSE(o.total_num_steps.has_value());
  EXPECT_DOUBLE_EQ(o.warmup_min_ratio, 0.05);
  EXPECT_DOUBLE_EQ(o.cos_min_ratio, 0.01);
}

// Two elements, the first without weight decay; ones for weights, 0.1 for gradients, lr 0.1.
torch::Tensor train_steps(optim::Optimizer& opt, int steps) {
  torch::Tensor p = torch::ones({2});
  const torch::Tensor g = torch::full({2}, 0.1f);
  for (int i = 0; i < steps; ++i) opt.step(p, g, 0.1);
  return p;
}

TEST(ComponentOptions, SgdFactoryAppliesMomentumAndDecayOutsideNoDecayRanges) {
  const config::Config c =
      load("training:\n  optimizer: sgd\n  momentum: 0.9\n  weight_decay: 0.5\n");
  auto opt = optimizer_factory(c)(2, {{0, 1}});
  const torch::Tensor p = train_steps(*opt, 2);
  EXPECT_EQ(opt->state().count("momentum_buffer"), 1u);
  // step 1: d = [0.1, 0.1 + 0.5·1]; buf = d; p = 1 - 0.1·buf = [0.99, 0.94]
  // step 2: d = [0.1, 0.1 + 0.5·0.94]; buf = 0.9·buf + d = [0.19, 1.11]; p -= 0.1·buf
  EXPECT_NEAR(p[0].item<double>(), 0.99 - 0.019, 1e-6);
  EXPECT_NEAR(p[1].item<double>(), 0.94 - 0.111, 1e-6);
}

TEST(ComponentOptions, AdamWFactoryTakesBetasEpsAndWeightDecay) {
  const config::Config c = load(
      "training:\n  optimizer: adamw\n  betas: [0.8, 0.9]\n  eps: 0.1\n"
      "  weight_decay: 0.1\n");
  auto opt = optimizer_factory(c)(2, {{0, 1}});
  const torch::Tensor p = train_steps(*opt, 1);
  const auto state = opt->state();
  ASSERT_EQ(state.count("exp_avg"), 1u);
  ASSERT_EQ(state.count("exp_avg_sq"), 1u);
  EXPECT_NEAR(state.at("exp_avg")[0].item<double>(), 0.2 * 0.1, 1e-7);      // (1 - beta1)·g
  EXPECT_NEAR(state.at("exp_avg_sq")[0].item<double>(), 0.1 * 0.01, 1e-8);  // (1 - beta2)·g²
  // Bias-corrected, the first update is lr·g/(|g| + eps) = 0.1·0.5; decay multiplies by 1 - lr·wd.
  EXPECT_NEAR(p[0].item<double>(), 1.0 - 0.05, 1e-6);
  EXPECT_NEAR(p[1].item<double>(), 1.0 * (1 - 0.01) - 0.05, 1e-6);
}

}  // namespace
}  // namespace dstrain::train
