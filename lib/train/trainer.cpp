#include "train/trainer.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>
#include <variant>

#include <torch/torch.h>

#include "comm/nccl_communicator.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/run_files.h"
#include "core/teardown_reason.h"
#include "core/timer.h"
#include "core/trace.h"
#include "hub/resolve.h"
#include "launcher/stage_inputs.h"
#include "metrics/progress.h"
#include "metrics/system.h"
#include "metrics/tracking.h"
#include "model/rng_state.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "train/component_options.h"
#include "train/device.h"
#include "train/expert_parallel.h"
#include "train/fused_check.h"
#include "train/graphs_choice.h"
#include "train/lora_setup.h"
#include "train/loss_normalization.h"
#include "train/memory_limit.h"
#include "train/parallelize.h"
#include "train/run_outputs.h"
#include "train/step_profiler.h"
#include "train/step_sync.h"

namespace dstrain::train {
namespace stdfs = std::filesystem;
using layout::Axis;

namespace {

// How long the end of a run may take to reach the trackers (a slow or dead MLflow server) at the
// end of training or after an error; after a signal, what the launcher's grace leaves
// (RankLifetime::end_seconds()).
constexpr double kFinishSeconds = 30;

// The cores this process may run on: its CPU affinity (Slurm's --cpus-per-task, taskset, a
// cgroup's cpuset), else every core of the machine.
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) {
    return CPU_COUNT(&set);
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Ranks on one machine share its cores: give each an equal part, so 2 ranks on 2 cores do not
// oversubscribe (which costs far more than it gains). OMP_NUM_THREADS, when set to a positive
// number, is the user's choice and wins, as it does in PyTorch. Returns the number of threads.
int set_intra_op_threads() {
  int threads = 0;
  if (const char* v = std::getenv("OMP_NUM_THREADS")) threads = std::atoi(v);
  if (threads <= 0) threads = std::max(1, usable_cores() / local_world_size());
  torch::set_num_threads(threads);
  return threads;
}

}  // namespace

Trainer::Trainer(config::Config config, std::string resume_from, World world,
                 RankLifetime* lifetime)
    : cfg_(std::move(config)),
      resume_from_(std::move(resume_from)),
      rank_(world.rank),
      world_(world.size),
      device_(world.device),
      comm_(std::move(world.comm)),
      lifetime_(lifetime),
      loss_normalization_(loss_normalization_from_word(cfg_.training.loss_normalization)) {}

Trainer::~Trainer() = default;

void Trainer::init() {
  log::set_rank(rank_);
  if (cfg_.logging.trace) trace::start();
  phase_peaks_ = std::make_unique<PhasePeaks>(allocator_peak_source(device_));
  const int threads = set_intra_op_threads();
  // LibTorch's default generator is otherwise seeded at random; training's draws (dropout) are
  // keyed by micro-batch and block (train_step).
  torch::manual_seed(cfg_.training.seed);
  resolve_model();
  build_data();
  plan_run();
  // Each fused GPU path against its eager ops on this card, before anything trains with it.
  const int64_t tokens = cfg_.data.max_length / size(Axis::kSequence);
  check_fused_kernels_for_run(*comm_, model_config_,
                              cfg_.training.per_device_train_batch_size * tokens, tokens,
                              plan_.engine.compute_dtype, device_);
  ParallelPlan plan =
      parallel_plan(cfg_, plan_, device_, plan_.layout.coordinate(Axis::kPipeline, rank_));
  plan.stage.peaks = phase_peaks_.get();
  if (plan_.graphs.on) plan.graph_recorder = model::cuda_graph_recorder(device_);
  // The whole model's values (a model built without memory names them), of which parallelize()
  // reads each rank's slice.
  model::DecoderModel whole(model_config_, model::Materialize::kNo);
  plan.initial_values = initial_values(*whole);
  if (cfg_.lora.enabled) {
    plan.lora = lora_plan(cfg_);
    base_checksum_ = base_checksum(plan.initial_values, *whole);
  }
  parallel_ = parallelize(*comm_, plan_.layout, device_, model_config_, std::move(plan));
  if (parallel_.lora) log_lora();
  confirm_micro_batch();
  // What the plan chose, said once (rank 0), and at the head of config.yaml below.
  std::vector<std::string> plan_said;
  for (const PlanLine& line : plan_lines(plan_, cfg_)) {
    if (rank_ == 0) log::write(line.warning ? log::Level::kWarn : log::Level::kInfo, line.text);
    plan_said.push_back(line.text);
  }
  build_loader();
  total_steps_ = cfg_.training.max_steps > 0 ? cfg_.training.max_steps
                                             : cfg_.training.epochs * loader_->steps_per_epoch();
  schedule_ = optim::make_lr_schedule(schedule_options(cfg_, total_steps_),
                                      cfg_.training.optimizer.lr, total_steps_);
  tokens_per_step_ = loader_->global_batch() * cfg_.data.max_length;
  create_checkpointer();
  if (!resume_from_.empty()) restore(resume_from_);
  // A tied embedding's copy on the head's stage, from the first stage's engine.
  parallel_.stage->sync_tied();
  if (rank_ == 0) {
    create_metrics();
    write_run_config(cfg_, plan_said);
  }
  log::info(
      "model {}: {:.2f}M parameters, {} layers; {} steps of {} tokens; zero stage {}; {} CPU "
      "thread(s) per rank",
      cfg_.model.name_or_path, model_config_.num_parameters(true) / 1e6,
      model_config_.num_hidden_layers, total_steps_, tokens_per_step_, cfg_.zero.stage, threads);
  if (parallel_.engine->can_update_during_backward()) {
    log::info("no gradient clipping: each bucket/unit is updated during backward, once reduced");
  }
}

void Trainer::plan_run() {
  // The auto choices plan against one limit, read before the engine places anything.
  RunFacts facts;
  facts.world_size = world_;
  facts.cuda = device_.is_cuda();
  if (needs_limit(cfg_, facts.cuda)) facts.limit = planning_limit(*comm_, device_);
  if (cfg_.training.micro_batch_auto) facts.kept_micro_batch = recorded_micro_batch();
  plan_ = resolve_run_plan(cfg_, model_config_, facts);
  if (cfg_.training.micro_batch_auto) {
    apply_micro_batch(cfg_.training, plan_.micro_batch, plan_.data_parallel);
  }
}

void Trainer::log_graphs_once() {
  if (!parallel_.graphs || graphs_logged_) return;
  graphs_logged_ = true;
  const model::LayerGraphStats st = parallel_.graphs->stats();
  const std::string timing =
      st.first_use_replay_seconds > 0
          ? fmt::format("; first use, all layers: replayed {:.3g} ms, eager {:.3g} ms",
                        st.first_use_replay_seconds * 1e3, st.first_use_eager_seconds * 1e3)
          : "";
  log::info(
      "CUDA graphs: {} recordings, {} replays, {} layer calls run eagerly in the first step{}{}",
      st.recordings, st.replays, st.eager_calls, timing,
      st.failure.empty() ? "" : " (recording stopped: " + st.failure + ")");
}

void Trainer::agree_graph_fallbacks_voted() {
  agree_graph_fallbacks(*comm_, *parallel_.graphs, voted_fallbacks_,
                        parallel_.model->blocks().size(), device_);
  voted_fallbacks_.clear();
}

void Trainer::create_metrics() {
  metrics_ = std::make_unique<metrics::MetricsLogger>();
  const std::string path = run_files::metrics_file(cfg_.logging.out_dir, cfg_.logging.metrics_path);
  metrics_->add_sink(std::make_unique<metrics::JsonlSink>(path, resume_from_.empty() ? -1 : step_));
  if (cfg_.logging.progress) {
    metrics_->add_sink(
        std::make_unique<metrics::ProgressSink>(total_steps_, metrics::stdout_is_terminal()));
  }
  metrics::TrackingSetup t;
  t.out_dir = cfg_.logging.out_dir;
  t.tensorboard = cfg_.logging.tensorboard;
  t.tensorboard_dir = cfg_.logging.tensorboard_dir;
  t.mlflow_tracking_uri = cfg_.logging.mlflow.tracking_uri;
  t.mlflow_experiment = cfg_.logging.mlflow_experiment;
  t.mlflow_parent_run_id = cfg_.logging.mlflow.parent_run_id;
  t.config_yaml = config::to_yaml(cfg_);
  for (auto& f : config::flatten(cfg_)) {
    metrics::tb::HParamValue v;
    std::visit([&](const auto& x) { v = x; }, f.value);
    t.settings.push_back({std::move(f.key), std::move(f.text), std::move(v)});
  }
  t.world_size = world_;
  t.zero_stage = cfg_.zero.stage;
  t.start_step = step_;
  t.resumed = !resume_from_.empty();
  metrics::add_tracking_sinks(*metrics_, t);
  // A signal ends the run within the launcher's grace period (5 s by default): FAILED when the
  // launcher stops the ranks because one failed (it said so on the teardown pipe), else KILLED.
  if (lifetime_ == nullptr) return;
  end_handle_ = lifetime_->on_end(
      [this](int, const std::optional<teardown::RankFailure>& failure, double seconds) {
        const metrics::RunStatus status =
            failure ? metrics::RunStatus::kFailed : metrics::RunStatus::kKilled;
        log::warn("the tracked run ends as {}", metrics::to_string(status));
        metrics_->finish(status, seconds);
      });
}

void Trainer::resolve_model() {
  // Every rank resolves the model; a hub id not yet cached is downloaded once per node (local rank
  // 0 downloads, the others wait on the cache's lock) or once for a cache shared between nodes.
  // A node-local copy staged by `launch --stage-dir` (launcher/stage_inputs.h) is read instead.
  hub::ResolveOptions where;
  if (const char* v = std::getenv("LOCAL_RANK")) where.local_rank = std::atoi(v);
  model_dir_ = launcher::staged_model_dir(cfg_.model);
  if (!model_dir_.empty()) {
    log::info("model {}: reading the node-local copy {}", cfg_.model.name_or_path, model_dir_);
  } else {
    model_dir_ =
        hub::resolve_model_dir(
            {cfg_.model.name_or_path, cfg_.model.revision, cfg_.model.init == "pretrained"}, where)
            .string();
  }
  model_config_ = model::load_model_config(model_dir_);
  // The layout against the model and the sequence: sequence parallelism splits the heads of one
  // tensor-parallel slice, and each tensor-parallel rank's token rows of its part of a sequence.
  const int64_t tp = cfg_.parallel.tensor_parallel_size, sp = cfg_.parallel.sequence_parallel_size;
  model::check_tensor_parallel(model_config_, tp, cfg_.model.name_or_path,
                               "parallel.tensor_parallel_size");
  check_expert_parallel(cfg_, model_config_, cfg_.model.name_or_path, cfg_.source_path);
  if (model_config_.moe.experts > 0 && cfg_.model.tiled_mlp != 0) {
    fail(ErrorKind::kConfig,
         "{}: model.tiled_mlp: a Mixture-of-Experts model ({}) has no tiled MLP; set it to 0",
         cfg_.source_path, model_config_.model_type);
  }
  apply_router_options(cfg_, model_config_);
  SequenceParallel::check_model(model::tensor_parallel_config(model_config_, 0, tp),
                                static_cast<int>(sp), cfg_.model.name_or_path);
  SequenceParallel::check_length(cfg_.data.max_length, static_cast<int>(sp));
  check_tensor_parallel_length(cfg_.data.max_length, static_cast<int>(sp), static_cast<int>(tp),
                               cfg_.parallel.tensor_sequence_parallel);
  const std::string tok = cfg_.model.tokenizer.empty() ? model_dir_ : cfg_.model.tokenizer;
  tokenizer_ = tokenizer::load_tokenizer(tok);
  if (tokenizer_->vocab_size() > model_config_.vocab_size) {
    fail(ErrorKind::kConfig,
         "{}: model.tokenizer: tokenizer {} has {} ids but the model's vocab_size is {}",
         cfg_.source_path, tok, tokenizer_->vocab_size(), model_config_.vocab_size);
  }
}

model::ValueSource Trainer::initial_values(model::DecoderModelImpl& whole) {
  if (cfg_.model.init != "pretrained") return model::init_source(whole, cfg_.training.seed);
  return model::weights_source(model_dir_, whole);
}

void Trainer::build_data() {
  datasets_ = data::build_datasets(data_options(cfg_), *tokenizer_);
}

void Trainer::build_loader() {
  // The ranks of a sequence-parallel group read the same samples.
  data::LoaderOptions options =
      loader_options(cfg_, size(Axis::kData), plan_.layout.coordinate(Axis::kData, rank_));
  options.pin_memory = device_.is_cuda();  // page-locked batches copy to the GPU asynchronously
  loader_ = std::make_unique<data::Loader>(datasets_.train, options);
}

data::Batch Trainer::on_device(data::Batch b) const {
  if (device_.is_cpu()) return b;
  b.input_ids = b.input_ids.to(device_, /*non_blocking=*/true);
  b.labels = b.labels.to(device_, /*non_blocking=*/true);
  return b;
}

namespace {

// Rows of packed documents (whole rows: a sequence-parallel rank's slice keeps their bounds); rows
// of one document each are plain rows (the same positions and attention): null.
std::shared_ptr<const model::Documents> packed_documents(const data::Batch& b) {
  const auto one_document = [](const std::vector<int64_t>& row) { return row.size() == 1; };
  if (std::all_of(b.documents.begin(), b.documents.end(), one_document)) return nullptr;
  return std::make_shared<const model::Documents>(model::Documents{b.documents});
}

}  // namespace

PipelineStage::MicroBatch Trainer::stage_batch(const data::Batch& whole) const {
  const SequenceParallel& sp = *parallel_.sequence_parallel;
  model::Positions positions = sp.positions(whole.input_ids.size(1));
  positions.documents = packed_documents(whole);
  const data::Batch b = sp.slice(whole);
  PipelineStage::MicroBatch mb{b.input_ids, b.labels, positions};
  // The padding a MoE model's router losses leave out (the rows' ends); none: no mask.
  const int64_t T = whole.input_ids.size(1);
  if (model_config_.moe.router_losses() &&
      std::any_of(whole.row_tokens.begin(), whole.row_tokens.end(),
                  [T](int64_t n) { return n < T; })) {
    const torch::Tensor ends = torch::tensor(whole.row_tokens, torch::kInt64).unsqueeze(1);
    const torch::Tensor real = torch::arange(T, torch::kInt64).unsqueeze(0).lt(ends);
    mb.real_tokens = real.narrow(1, positions.first, b.input_ids.size(1)).to(device_);
  }
  return mb;
}

void Trainer::all_reduce(std::vector<double>& values, comm::ReduceOp op) {
  auto t = torch::tensor(values, torch::kFloat64).to(device_);
  // A host wait with the communicator's timeout: once per step, a hung collective anywhere
  // surfaces here as an error naming the rank instead of blocking the device copy forever.
  comm::synchronize(*comm_->all_reduce(t, op));
  t = t.cpu();
  for (size_t i = 0; i < values.size(); ++i) values[i] = t[static_cast<int64_t>(i)].item<double>();
}

// One optimizer step's micro-batches: the loader says which micro-step each one is, and the last
// one ends the step. They are read first: their labels and tokens, summed over the ranks, normalise
// the loss (loss_normalization.h) and count the step's real tokens. Returns this rank's value of
// the step's loss, whose mean over the ranks is the step's loss (mean_loss_over_ranks), on the
// device.
torch::Tensor Trainer::train_step(double* fwd_bwd_s, double* data_s) {
  std::vector<data::Batch> batches;
  std::vector<double> counts = {0.0, 0.0};  // labelled positions, document tokens
  {
    Stopwatch d;
    trace::Span data_span("data", "data");
    do {
      batches.push_back(on_device(loader_->next()));
      counts[0] += static_cast<double>(batches.back().labelled);
      counts[1] += static_cast<double>(batches.back().tokens);
    } while (!batches.back().last_micro_step);
    *data_s += d.seconds();
  }
  // Summed over the world, over-counting the ranks that read the same samples (a sequence- or
  // tensor-parallel group, a pipeline). On a GPU the sum stays on the device, ordered before the
  // step's backward (no host wait).
  torch::Tensor host = torch::tensor(counts, torch::kFloat64);
  if (device_.is_cuda()) host = host.pin_memory();
  torch::Tensor step_counts = host.to(device_, /*non_blocking=*/true);
  comm_->all_reduce(step_counts, comm::ReduceOp::kSum)->wait();
  step_counts = step_counts / static_cast<double>(plan_.layout.group_size(layout::kSameSamples));
  interval_tokens_ =
      interval_tokens_.defined() ? interval_tokens_ + step_counts[1] : step_counts[1].clone();
  Stopwatch f;
  step_router_ = torch::Tensor();
  // Each micro-batch's loss as loss_normalization.h says, with sequence parallelism over the
  // group's whole sequences.
  const torch::Tensor scale =
      micro_step_scale(loss_normalization_, step_counts[0], static_cast<int64_t>(batches.size()),
                       parallel_.stage->chunks(), size(Axis::kData));
  const PipelineStage::MicroStepLoss loss = [&](const model::LossSum& head) {
    const model::LossSum whole = parallel_.sequence_parallel->reduce_loss(head);
    if (whole.router.defined()) {
      const torch::NoGradGuard no_grad;
      const model::RouterLosses r = model::router_losses(whole.router);
      const torch::Tensor mean =
          torch::stack({r.aux, r.z}).to(torch::kDouble) / static_cast<double>(batches.size());
      step_router_ = step_router_.defined() ? step_router_ + mean : mean;
    }
    return micro_step_loss(whole, loss_normalization_, scale, model_config_.moe,
                           parallel_.stage->chunks());
  };
  // Each micro-batch's draws keyed by the seed, the step, its index and the tokens: the ranks that
  // compute parts of the same tokens (a pipeline's stages, a tensor-parallel group) draw what one
  // rank draws (lora_model.h); other samples, and a sequence-parallel rank's other tokens, draw
  // otherwise.
  const int tokens = plan_.layout.group_index(Axis::kPipeline | Axis::kTensor, rank_);
  std::vector<PipelineStage::MicroBatch> micro_batches;
  for (data::Batch& b : batches) {
    PipelineStage::MicroBatch mb = stage_batch(b);
    mb.draws = model::draw_key({cfg_.training.seed, static_cast<uint64_t>(step_),
                                micro_batches.size(), static_cast<uint64_t>(tokens)});
    micro_batches.push_back(std::move(mb));
    b = data::Batch();
  }
  const trace::Span span("pipeline", "schedule");
  parallel_.stage->run(micro_batches, loss, "training.gradient_accumulation_steps");
  *fwd_bwd_s += f.seconds();
  return parallel_.stage->step_loss().clone();
}

double Trainer::mean_loss_over_ranks(const torch::Tensor& local_loss) {
  torch::Tensor sum = local_loss.reshape({1}).clone();  // fp64, on the device
  comm::synchronize(*comm_->all_reduce(sum, comm::ReduceOp::kSum));
  // Every rank of a pipeline's last stage holds a value; the other stages' are zero.
  const double loss =
      sum.item<double>() / static_cast<double>(plan_.layout.group_size(layout::kStage));
  if (!std::isfinite(loss)) {
    fail(ErrorKind::kRuntime, "training diverged: loss is {} at step {}", loss, step_);
  }
  return loss;
}

EvalResult Trainer::evaluate() {
  const trace::Span span("eval", "eval");
  EvalResult r;
  if (!datasets_.eval) return r;
  torch::NoGradGuard no_grad;
  parallel_.model->eval();
  const int64_t micro = cfg_.training.per_device_eval_batch_size > 0
                            ? cfg_.training.per_device_eval_batch_size
                            : cfg_.training.per_device_train_batch_size;
  data::EvalLoader eval(datasets_.eval, micro, size(Axis::kData),
                        plan_.layout.coordinate(Axis::kData, rank_), device_.is_cuda());
  int64_t batches = eval.num_batches();
  if (cfg_.training.eval_max_batches > 0) {
    batches = std::min(batches, cfg_.training.eval_max_batches);
  }
  std::vector<double> acc = {0.0, 0.0};
  const auto add = [&acc](const model::LossSum& ls) {
    acc[0] += ls.sum.item<double>();
    acc[1] += static_cast<double>(ls.count.item<int64_t>());
  };
  // Through the pipeline as many batches at a time as it has stages (only the last stage's losses
  // are not zero). Each rank's own tokens: summed over the world, every token counts once.
  std::vector<PipelineStage::MicroBatch> in_pipeline;
  for (int64_t i = 0; i < batches; ++i) {
    auto next = eval.next();
    if (!next) break;
    in_pipeline.push_back(stage_batch(on_device(std::move(*next))));
    if (static_cast<int>(in_pipeline.size()) == size(Axis::kPipeline)) {
      add(parallel_.stage->evaluate(in_pipeline));
      in_pipeline.clear();
    }
  }
  if (!in_pipeline.empty()) add(parallel_.stage->evaluate(in_pipeline));
  parallel_.model->train();
  all_reduce(acc);
  // The ranks of a tensor-parallel group scored the same tokens.
  for (double& v : acc) v /= size(Axis::kTensor);
  r.tokens = static_cast<int64_t>(acc[1]);
  r.loss = acc[1] > 0 ? acc[0] / acc[1] : 0.0;
  r.ppl = std::exp(r.loss);
  return r;
}

std::vector<std::pair<std::string, double>> Trainer::fullest_rank_memory() {
  std::vector<std::pair<std::string, double>> m = {
      {"memory/rss_mb", static_cast<double>(metrics::current_rss_bytes()) / 1e6},
      {"memory/peak_rss_mb", static_cast<double>(metrics::peak_rss_bytes()) / 1e6},
      {"memory/model_states_mb",
       static_cast<double>(parallel_.engine->bytes().model_states()) / 1e6}};
  for (const auto& [key, value] : device_memory_metrics(device_)) {
    // The allocator's own peak is reset at every phase's end: the run's comes from phase_peaks_.
    if (phase_peaks_->active() && key == "memory/peak_allocated_mb") continue;
    m.emplace_back(key, value);
  }
  std::vector<double> values;
  for (const auto& [key, value] : m) values.push_back(value);
  all_reduce(values, comm::ReduceOp::kMax);
  for (size_t i = 0; i < m.size(); ++i) m[i].second = values[i];
  return m;
}

std::vector<std::pair<std::string, double>> Trainer::router_metrics() {
  std::vector<std::pair<std::string, double>> m;
  const model::MoeConfig& moe = model_config_.moe;
  if (moe.experts == 0) return m;
  torch::Tensor load = parallel_.stage->take_expert_load();
  if (!load.defined()) {
    load = torch::zeros({model_config_.moe_layers(), moe.experts},
                        torch::TensorOptions(device_).dtype(torch::kFloat));
  }
  comm::synchronize(*comm_->all_reduce(load, comm::ReduceOp::kSum));
  load = load.cpu() / size(Axis::kTensor);  // (a tensor-parallel group routes the same tokens)
  double worst = 0;
  int64_t dead = 0;
  for (int64_t layer = 0, slot = 0; layer < model_config_.num_hidden_layers; ++layer) {
    if (!model_config_.is_moe_layer(layer)) continue;
    const torch::Tensor l = load[slot++];
    const double mean = l.mean().item<double>();
    const double ratio = mean > 0 ? l.max().item<double>() / mean : 0.0;
    const int64_t none = l.eq(0).sum().item<int64_t>();
    m.emplace_back(fmt::format("moe/layer_{}/load_max_over_mean", layer), ratio);
    m.emplace_back(fmt::format("moe/layer_{}/dead_experts", layer), static_cast<double>(none));
    worst = std::max(worst, ratio);
    dead += none;
  }
  m.emplace_back("moe/load_max_over_mean", worst);
  m.emplace_back("moe/dead_experts", static_cast<double>(dead));
  if (const int ep = size(Axis::kExpert); ep > 1) {
    // The rows each expert-parallel rank's experts computed (summed over the expert-parallel
    // groups), the busiest over the mean: the worst layer's.
    const torch::Tensor per_rank = load.view({load.size(0), ep, -1}).sum(2);
    const torch::Tensor mean = per_rank.mean(1).clamp_min(1e-30);
    m.emplace_back("moe/expert_parallel/received_max_over_mean",
                   (std::get<0>(per_rank.max(1)) / mean).max().item<double>());
  }
  if (moe.router_losses()) {
    const torch::Tensor local =
        step_router_.defined() ? step_router_ : torch::zeros({2}, torch::kDouble).to(device_);
    std::vector<double> values = {local[0].item<double>(), local[1].item<double>()};
    all_reduce(values);
    const auto ranks = static_cast<double>(plan_.layout.group_size(layout::kStage));
    if (moe.aux_loss) m.emplace_back("train/aux_loss", values[0] / ranks);
    if (moe.z_loss_coef > 0) m.emplace_back("train/z_loss", values[1] / ranks);
  }
  return m;
}

void Trainer::log_step(double loss, const zero::StepResult& r, double lr, double interval_s,
                       int64_t interval_steps, double fwd_bwd_s, double data_s, double step_s) {
  const auto memory = fullest_rank_memory();
  const auto router = router_metrics();
  if (!metrics_) return;
  const double per_step = interval_s / static_cast<double>(std::max<int64_t>(1, interval_steps));
  const double tps = static_cast<double>(tokens_per_step_) / per_step;
  // Document tokens of the interval's steps over every rank (a host read: log steps only).
  const double real_tokens = interval_tokens_.defined() ? interval_tokens_.item<double>() : 0.0;
  metrics::Record rec{step_, {}};
  rec.add("train/loss", loss);
  rec.add("train/ppl", std::exp(loss));
  for (const auto& [key, value] : router) rec.add(key, value);
  rec.add("lr", lr);
  rec.add("grad_norm", r.grad_norm());
  if (cfg_.training.fp16) rec.add("loss_scale", r.loss_scale);
  if (r.skipped) rec.add("skipped", 1);
  rec.add("tokens_per_s", tps);
  rec.add("real_tokens_per_s", real_tokens / interval_s);
  rec.add("padding_fraction",
          1.0 - real_tokens / (static_cast<double>(tokens_per_step_) *
                               static_cast<double>(std::max<int64_t>(1, interval_steps))));
  const double peak = metrics::peak_flops_from_env(0.0);
  const double flops_per_token = model_config_.training_flops_per_token(cfg_.data.max_length);
  if (peak > 0) rec.add("mfu", metrics::mfu(flops_per_token, tps, peak));
  rec.add("step_time_s", per_step);
  rec.add("time/data_s", data_s);
  rec.add("time/fwd_bwd_s", fwd_bwd_s);
  rec.add("time/optimizer_s", step_s);
  rec.add("tokens_seen", static_cast<double>(tokens_seen_));
  for (const auto& [key, value] : memory) rec.add(key, value);
  for (const auto& [key, value] : phase_peaks_->take_metrics()) rec.add(key, value);
  if (parallel_.graphs) {
    rec.add("memory/graph_pools_mb", static_cast<double>(parallel_.graphs->pool_bytes()) / 1e6);
    rec.add("graphs/eager_layers", static_cast<double>(parallel_.graphs->stats().eager_layers));
  }
  rec.add("eta_s", per_step * static_cast<double>(total_steps_ - step_));
  metrics_->write(rec);
  if (cfg_.logging.wall_clock_breakdown) {
    // DeepSpeed's wall_clock_breakdown: the phases of the last step, at every log step.
    log::info(
        "step {} time (ms) | data: {:.2f} | forward+backward: {:.2f} | optimizer: {:.2f} | "
        "step: {:.2f}",
        step_, data_s * 1e3, fwd_bwd_s * 1e3, step_s * 1e3, per_step * 1e3);
  }
}

void Trainer::log_eval(const EvalResult& e) {
  last_eval_loss_ = e.loss;
  if (!metrics_) return;
  metrics::Record rec{step_, {}};
  rec.add("eval/loss", e.loss);
  rec.add("eval/ppl", e.ppl);
  rec.add("eval/tokens", static_cast<double>(e.tokens));
  metrics_->write(rec);
}

RunSummary Trainer::run() {
  try {
    try {
      return run_steps();
    } catch (const c10::OutOfMemoryError& e) {
      // The device's memory, not a bug: a runtime error that says what to try.
      fail(ErrorKind::kRuntime,
           "rank {} ran out of memory on {}: {}\nThe knobs to try, in order, and what each costs: "
           "docs/troubleshooting.md (dstrain estimate shows what a rank holds)",
           rank_, device_.str(), e.what_without_backtrace());
    }
  } catch (...) {
    save_rank_trace(cfg_, rank_);
    if (metrics_) metrics_->finish(metrics::RunStatus::kFailed, kFinishSeconds);
    throw;
  }
}

RunSummary Trainer::run_steps() {
  Stopwatch total;
  init();
  RunSummary s;
  const int64_t tokens_at_start = tokens_seen_;
  const int64_t steps_per_epoch = loader_->steps_per_epoch();
  int64_t last_eval_step = -1;
  int64_t last_save_step = resume_from_.empty() ? -1 : step_;
  Stopwatch interval;
  int64_t interval_steps = 0;
  double fwd_bwd = 0, data_t = 0, opt_t = 0;
  // The stop vote (SIGUSR1) of a step is resolved after the next one (step_sync.h); the loss is
  // read only when it is logged, saved or final: other steps wait for nothing on the device.
  DeferredSum stop_vote(*comm_, device_);
  StepProfiler profiler(cfg_.logging.profile_steps, step_, total_steps_, device_.is_cuda(),
                        cfg_.logging.out_dir, rank_);
  while (step_ < total_steps_) {
    profiler.before_step(step_);
    const trace::Span step_span("step", "step", {"step", step_ + 1});
    const double lr = schedule_->lr(step_);
    parallel_.engine->set_step_lr(lr);
    const torch::Tensor local_loss = train_step(&fwd_bwd, &data_t);
    Stopwatch o;
    trace::Span optimizer_span("optimizer", "optimizer");
    const zero::StepResult r = parallel_.engine->step(lr);
    parallel_.stage->sync_tied();
    optimizer_span.set_arg(peak_arg(*phase_peaks_, StepPhase::kOptimizer));
    optimizer_span.end();
    opt_t += o.seconds();
    ++step_;
    if (rank_ == 0) log_graphs_once();
    profiler.after_step(step_);
    ++interval_steps;
    tokens_seen_ += tokens_per_step_;
    // With CUDA graphs the vote also carries how many layers each rank's graphs stopped replaying
    // (layer_graphs.h): any, and the ranks agree which layers every rank runs eagerly from the
    // next step on.
    const std::vector<double> votes =
        stop_vote.pending() ? stop_vote.finish() : std::vector<double>{};
    const bool stop = !votes.empty() && votes[0] > 0;
    if (votes.size() > 1 && votes[1] > 0) agree_graph_fallbacks_voted();
    if (!stop && step_ < total_steps_) {
      std::vector<double> vote = {RankLifetime::stop_requested().load() ? 1.0 : 0.0};
      if (parallel_.graphs) {
        voted_fallbacks_ = parallel_.graphs->take_fallbacks();
        vote.push_back(static_cast<double>(voted_fallbacks_.size()));
      }
      stop_vote.start(vote);
    }
    const bool log_due =
        step_ % cfg_.training.log_interval == 0 || step_ == 1 || step_ == total_steps_;
    const bool save_due = cfg_.checkpoint.interval > 0 && step_ % cfg_.checkpoint.interval == 0;
    if (log_due || save_due || stop) last_loss_ = mean_loss_over_ranks(local_loss);
    if (log_due) {
      const double n = static_cast<double>(interval_steps);
      log_step(last_loss_, r, lr, interval.seconds(), interval_steps, fwd_bwd / n, data_t / n,
               opt_t / n);
      interval.reset();
      interval_steps = 0;
      interval_tokens_ = torch::Tensor();
      fwd_bwd = data_t = opt_t = 0;
    }
    const bool epoch_end = step_ % steps_per_epoch == 0;
    const bool eval_due =
        cfg_.training.eval_interval > 0 && step_ % cfg_.training.eval_interval == 0;
    if (datasets_.eval && (eval_due || epoch_end)) {
      log_eval(evaluate());
      last_eval_step = step_;
    }
    if (stop) {
      save_checkpoint();
      finish_saves();
      log::info("stop requested (SIGUSR1): checkpoint saved at step {}", step_);
      s.preempted = true;
      break;
    }
    if (save_due) {
      save_checkpoint();
      last_save_step = step_;
    }
    report_saves();
  }
  if (!s.preempted) {
    if (datasets_.eval && last_eval_step != step_) log_eval(evaluate());
    if (cfg_.checkpoint.save_final && last_save_step != step_) save_checkpoint();
    if (parallel_.lora) save_lora_adapter();
    finish_saves();
  }
  s.steps = step_;
  s.tokens = tokens_seen_;
  s.tokens_this_run = tokens_seen_ - tokens_at_start;
  s.train_loss = last_loss_;
  s.eval_loss = last_eval_loss_;
  s.seconds = total.seconds();
  s.checkpoint = last_checkpoint_;
  if (rank_ == 0) write_summary(s);
  if (metrics_) {
    metrics_->finish(s.preempted ? metrics::RunStatus::kKilled : metrics::RunStatus::kFinished,
                     kFinishSeconds);
  }
  save_rank_trace(cfg_, rank_);
  comm_->barrier();
  if (rank_ == 0) write_run_outputs(cfg_, world_);
  return s;
}

}  // namespace dstrain::train
