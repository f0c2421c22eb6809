#pragma once
// The Trainer runs one rank's lifetime: init (rendezvous, tokenizer, model, data, engine, restore)
// → train (epochs or max_steps, eval every eval_interval steps and at each epoch end, checkpoints
// every checkpoint.interval steps) → final eval → final checkpoint → summary.json (rank 0).
// Every rank runs the same sequence of collectives; rank 0 alone writes metrics.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "ckpt/checkpointer.h"
#include "comm/communicator.h"
#include "config/config.h"
#include "data/datasets.h"
#include "data/loader.h"
#include "layout/parallel_layout.h"
#include "lora/lora_model.h"
#include "metrics/sinks.h"
#include "model/model.h"
#include "optim/lr_schedule.h"
#include "tokenizer/tokenizer.h"
#include "train/device.h"
#include "train/loss_normalization.h"
#include "train/parallel_groups.h"
#include "train/parallelize.h"
#include "train/phase_peaks.h"
#include "train/pipeline.h"
#include "train/rank_lifetime.h"
#include "train/run_plan.h"
#include "train/sequence_parallel.h"
#include "train/tensor_parallel.h"
#include "zero/engine.h"

namespace dstrain::train {

struct EvalResult {
  double loss = 0;
  double ppl = 0;
  int64_t tokens = 0;
};

struct RunSummary {
  int64_t steps = 0;
  int64_t tokens = 0;           // tokens seen by the run, resumed ones included
  int64_t tokens_this_run = 0;  // tokens trained by this process lifetime
  double train_loss = 0;
  double eval_loss = -1;  // -1: no eval set
  double seconds = 0;
  std::string checkpoint;  // the final checkpoint's tag directory ("" when none was written)
  bool preempted = false;  // stopped early by SIGUSR1 after saving a checkpoint
};

class Trainer {
 public:
  // `resume_from`: a complete checkpoint tag directory, or "". `world`: this rank's place, device
  // and communicator (join_world_from_env() for a launched rank). `lifetime`: the process's
  // (rank_lifetime.h), whose SIGUSR1 stop request the ranks vote on (RankLifetime::stop_requested)
  // and whose end runs rank 0's tracked runs' end; null: nothing runs at a signal.
  Trainer(config::Config config, std::string resume_from, World world,
          RankLifetime* lifetime = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  RunSummary run();

 private:
  // The whole run; run() adds the tracking status on the way out (FAILED on an error).
  RunSummary run_steps();
  void init();
  // Rank 0: metrics.jsonl, the progress line, TensorBoard, MLflow, and their end at a signal
  // (FAILED when the launcher stops the job for a failed rank, else KILLED; lifetime_->on_end).
  void create_metrics();
  // The model's directory and config.json, and the tokenizer.
  void resolve_model();
  // The values of `whole`'s parameters (the whole model, built without memory) by name: ranges of
  // its safetensors files (model.init: pretrained, checked against its shapes), or the seeded
  // initialisation.
  model::ValueSource initial_values(model::DecoderModelImpl& whole);
  // LoRA: lora::base_checksum of the base `whole`, computed by the ranks together from its
  // initial values (each rank checksums every world-th parameter) without materialising it.
  std::string base_checksum(const model::ValueSource& values, model::DecoderModelImpl& whole);
  // Collective: the run plan (run_plan.h) against this rank's world and device, the micro-batch
  // it chose applied to cfg_.
  void plan_run();
  // Rank 0, after the first step: what the graphs recorded and replayed.
  void log_graphs_once();
  // A collective, after a step whose stop vote counted a fallback of the graphs on some rank:
  // every rank runs the layers that fell back anywhere eagerly (agree_graph_fallbacks).
  void agree_graph_fallbacks_voted();
  // The datasets; the loader is built once the micro-batch is known (build_loader).
  void build_data();
  void build_loader();
  // training.per_device_train_batch_size: auto (trainer_micro_batch.cpp, micro_batch_auto.h),
  // once the engine is built: one trial step per candidate from the plan's micro-batch down until
  // one fits every rank (not for a micro-batch kept from the checkpoint); sets plan_ and
  // cfg_.training's micro-batch and accumulation.
  void confirm_micro_batch();
  // Collective: the two micro-steps of a step of two at micro-batch `micro` (the last with the
  // gradient reduction), no update, then discarded; false when some rank ran out of memory in the
  // first (CUDA). Error(kRuntime) when that cannot be survived (see the .cpp).
  bool trial_step_fits(int64_t micro);
  // The micro-batch a checkpoint being resumed recorded for this run's data-parallel ranks and
  // samples per rank, else 0.
  int64_t recorded_micro_batch() const;
  // What the checkpoint records of the choice (progress state); null without auto.
  nlohmann::json micro_batch_record() const;
  // `b` with its tensors on the compute device (non-blocking copies from pinned memory on CUDA).
  data::Batch on_device(data::Batch b) const;
  // What this rank's stages compute of `whole` (a batch of whole sequences): with sequence
  // parallelism its slice of them, at their positions in the sequence.
  PipelineStage::MicroBatch stage_batch(const data::Batch& whole) const;
  // One optimizer step's micro-batches through this rank's stages. Returns this rank's value of
  // the step's loss (zero but on the last stage), whose mean over a stage's ranks is the step's.
  torch::Tensor train_step(double* fwd_bwd_s, double* data_s);
  // The layout's size of `axis` (layout/parallel_layout.h).
  int size(layout::Axis axis) const { return plan_.layout.size(axis); }
  // Collective: the mean over ranks of each rank's `local_loss` (a host read); Error(kRuntime) when
  // it is not finite (training diverged).
  double mean_loss_over_ranks(const torch::Tensor& local_loss);
  EvalResult evaluate();
  // Checkpoints (trainer_checkpoint.cpp). save_checkpoint() is collective and returns once the
  // state is snapshotted (checkpoint.async) or written; report_saves() logs finished saves and
  // applies checkpoint.on_error to failed ones; finish_saves() waits for the save in flight.
  void create_checkpointer();
  void save_checkpoint();
  void report_saves();
  void finish_saves();
  void restore(const std::string& tag_dir);
  // Collective: memory/* (but the phase peaks) of the rank that holds the most, each figure's
  // largest over the ranks: a pipeline's stages, a data-parallel rank's shard, hold different
  // amounts.
  std::vector<std::pair<std::string, double>> fullest_rank_memory();
  // Collective (the memory figures); rank 0 writes the line.
  void log_step(double loss, const zero::StepResult& r, double lr, double interval_s,
                int64_t interval_steps, double fwd_bwd_s, double data_s, double step_s);
  void log_eval(const EvalResult& e);
  void write_summary(const RunSummary& s);
  // All-reduces `values` across ranks in place (sum, or `op`).
  void all_reduce(std::vector<double>& values, comm::ReduceOp op = comm::ReduceOp::kSum);
  // A MoE model's metrics of the log interval (collective): per MoE layer the most tokens an
  // expert got over the experts' mean and the experts none was routed to, summed over the ranks
  // and the interval's steps, the worst layer's ratio and all dead experts; the last step's router
  // losses. Empty for a dense model.
  std::vector<std::pair<std::string, double>> router_metrics();

  // LoRA (lora_setup.cpp). The adapters' settings and size, once attached.
  void log_lora() const;
  // The LoRA run's checkpoint reference: adapter settings and the base model with its checksum.
  nlohmann::json lora_reference_json() const;
  // Collective: rank 0 writes logging.out_dir/lora_adapter/ from the fp32 master weights.
  void save_lora_adapter();

  config::Config cfg_;
  std::string resume_from_;
  int rank_ = 0;
  int world_ = 1;
  torch::Device device_{torch::kCPU};  // cuda:LOCAL_RANK or the CPU (device.h)
  std::unique_ptr<comm::Communicator> comm_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::string model_dir_;
  model::ModelConfig model_config_;
  RunPlan plan_;  // what the run decided before building anything, its layout included
  data::Datasets datasets_;
  std::unique_ptr<data::Loader> loader_;
  // The layout's groups, the model, its adapters (LoRA), CUDA graphs, ZeRO engine and pipeline
  // stage (parallelize.h), the whole world's collectives over comm_.
  Parallelized parallel_;
  std::string base_checksum_;  // LoRA: lora::base_checksum of the fp32 base weights
  bool graphs_logged_ = false;
  std::vector<model::LayerFallback> voted_fallbacks_;  // this rank's, in the pending stop vote
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<ckpt::Stateful> progress_state_;
  std::unique_ptr<ckpt::Stateful> engine_state_;  // the engine's, in whole coordinates
  std::unique_ptr<ckpt::Stateful> lora_reference_;
  std::unique_ptr<ckpt::Checkpointer> checkpointer_;  // after the components it saves
  struct {
    int64_t saves = 0;
    int64_t failed = 0;
    int64_t bytes = 0;
    double stall_s = 0;  // training loop time spent in saves
    double write_s = 0;  // writer time (in the background when async)
  } ckpt_stats_;
  std::unique_ptr<metrics::MetricsLogger> metrics_;
  RankLifetime* lifetime_ = nullptr;
  RankLifetime::EndHandle end_handle_;       // after metrics_, which it uses
  std::unique_ptr<PhasePeaks> phase_peaks_;  // memory/peak_allocated_mb by phase (CUDA only)
  int64_t total_steps_ = 0;
  int64_t step_ = 0;  // optimizer steps completed
  int64_t tokens_seen_ = 0;
  int64_t tokens_per_step_ = 0;
  LossNormalization loss_normalization_ = LossNormalization::kTokens;
  torch::Tensor interval_tokens_;  // document tokens since the last log step, over every rank
  // A MoE model's router losses (aux, z) of the last step on this rank: its micro-batches' mean.
  torch::Tensor step_router_;
  double last_loss_ = 0;
  double last_eval_loss_ = -1;
  std::string last_checkpoint_;
};

}  // namespace dstrain::train
