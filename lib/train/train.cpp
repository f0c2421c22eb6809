#include "train/train.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include <nlohmann/json.hpp>

#include "ckpt/layout.h"
#include "ckpt/manifest.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "launcher/slurm.h"
#include "train/rank_lifetime.h"
#include "train/trainer.h"

namespace dstrain::train {
namespace stdfs = std::filesystem;

namespace {

// A rank started directly by srun (`srun dstrain train CONFIG`) has SLURM_* but no RANK: map them
// onto the torchrun variables before anything reads the world from the environment.
void adopt_slurm_environment() {
  for (const auto& [key, value] : launcher::torch_env_from_slurm(launcher::current_environment())) {
    ::setenv(key.c_str(), value.c_str(), 1);
  }
}

}  // namespace

int run_train(const TrainOptions& options) {
  // First, so that the launcher watches this rank from its start (core/liveness.h) and a signal
  // during start-up is reported like any other.
  RankLifetime lifetime;
  adopt_slurm_environment();
  const comm::RendezvousOptions ro = comm::rendezvous_options_from_env();
  log::set_rank(ro.rank);
  config::LoadOptions lo;
  lo.overrides = options.overrides;
  lo.world_size = ro.world_size;
  const config::Config cfg = config::load_config(options.config_path, lo);
  if (options.print_config) {
    if (ro.rank <= 0) std::fputs(config::to_yaml(cfg).c_str(), stdout);
    return 0;
  }
  Trainer trainer(
      cfg,
      options.resume_from.empty() ? std::string() : ckpt::resolve_checkpoint(options.resume_from),
      join_world_from_env(), &lifetime);
  const RunSummary s = trainer.run();
  log::info("done: {} steps, train loss {:.4f}{}, {:.1f}s{}", s.steps, s.train_loss,
            s.eval_loss >= 0 ? fmt::format(", eval loss {:.4f}", s.eval_loss) : std::string(),
            s.seconds, s.checkpoint.empty() ? std::string() : ", checkpoint " + s.checkpoint);
  return 0;
}

int run_resume(const ResumeOptions& options) {
  launcher::ResumeCheckpoint c;
  c.tag_dir = stdfs::absolute(ckpt::resolve_checkpoint(options.checkpoint)).string();
  c.config_path = (stdfs::path(c.tag_dir) / ckpt::kRunConfigFile).string();
  const ckpt::Manifest manifest = ckpt::read_manifest(c.tag_dir);
  c.world_size = manifest.world_size;
  // The record lives beside the checkpoint's tag directories (launcher/launch_record.h).
  const std::string checkpoint_dir = stdfs::path(c.tag_dir).parent_path().string();
  c.record_path = launcher::launch_record_path(checkpoint_dir);
  c.record = launcher::read_launch_record(checkpoint_dir);
  launcher::ResumeEnvironment env;
  const char* job = std::getenv("SLURM_JOB_ID");
  env.in_slurm_allocation = job != nullptr && *job != '\0';
  if (const char* nodes = std::getenv("SLURM_JOB_NUM_NODES")) env.slurm_nodes = std::atoi(nodes);
  env.cwd = stdfs::current_path().string();
  env.variables = launcher::recorded_environment(environ, {});
  const launcher::ResumePlan plan = launcher::plan_resume(options.request, c, env);
  log::info("resuming {} (step {}, {} rank(s)) {}", c.tag_dir, manifest.step, manifest.world_size,
            plan.how);
  for (const std::string& note : plan.notes) log::info("{}", note);
  return launcher::run_resume_launch(plan);
}

}  // namespace dstrain::train
