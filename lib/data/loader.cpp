#include "data/loader.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "core/trace.h"

namespace dstrain::data {
namespace {

LoaderState advance(LoaderState s, int64_t accum_steps, int64_t steps_per_epoch) {
  if (++s.micro_step < accum_steps) return s;
  s.micro_step = 0;
  if (++s.step < steps_per_epoch) return s;
  s.step = 0;
  ++s.epoch;
  return s;
}

void check_state(const LoaderState& s, int64_t global_batch, int64_t num_samples,
                 int64_t steps_per_epoch, int64_t accum_steps) {
  if (s.global_batch != 0 && s.global_batch != global_batch) {
    fail(ErrorKind::kInput,
         "data loader state was saved with a global batch of {} samples, this run has {}; resume "
         "with the same micro batch x gradient accumulation x world size",
         s.global_batch, global_batch);
  }
  if (s.num_samples != 0 && s.num_samples != num_samples) {
    fail(ErrorKind::kInput,
         "data loader state was saved for a dataset of {} samples, this run's has {}; the data or "
         "data.max_length/packing/add_bos changed",
         s.num_samples, num_samples);
  }
  if (s.epoch < 0 || s.step < 0 || s.step >= steps_per_epoch || s.micro_step < 0 ||
      s.micro_step >= accum_steps) {
    fail(ErrorKind::kInput, "data loader state (epoch {}, step {}, micro step {}) is out of range",
         s.epoch, s.step, s.micro_step);
  }
}

}  // namespace

std::string loader_state_to_json(const LoaderState& s) {
  nlohmann::json j = {{"epoch", s.epoch},
                      {"step", s.step},
                      {"micro_step", s.micro_step},
                      {"global_batch", s.global_batch},
                      {"num_samples", s.num_samples}};
  return j.dump();
}

LoaderState loader_state_from_json(std::string_view json, const std::string& origin) {
  try {
    const auto j = nlohmann::json::parse(json);
    LoaderState s;
    s.epoch = j.at("epoch").get<int64_t>();
    s.step = j.at("step").get<int64_t>();
    s.micro_step = j.value("micro_step", int64_t{0});
    s.global_batch = j.value("global_batch", int64_t{0});
    s.num_samples = j.value("num_samples", int64_t{0});
    return s;
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::kInput, "{}: bad data loader state: {}", origin, e.what());
  }
}

Loader::Loader(std::shared_ptr<const SampleSet> samples, const LoaderOptions& options,
               const LoaderState& start_state)
    : samples_(std::move(samples)), options_(options) {
  sampler_options_ = {samples_->size(),   options.micro_batch, options.accum_steps,
                      options.world_size, options.rank,        options.seed,
                      options.shuffle,    options.drop_last,   samples_->name()};
  DistributedSampler probe(sampler_options_);  // validates sizes before a thread starts
  steps_per_epoch_ = probe.steps_per_epoch();
  global_batch_ = probe.global_batch();
  start(start_state);
}

Loader::~Loader() = default;

void Loader::start(const LoaderState& state) {
  check_state(state, global_batch_, samples_->size(), steps_per_epoch_, options_.accum_steps);
  prefetcher_.reset();
  next_ = state;
  next_.global_batch = global_batch_;
  next_.num_samples = samples_->size();
  auto sampler = std::make_shared<DistributedSampler>(sampler_options_);
  auto cursor = std::make_shared<LoaderState>(next_);
  const LoaderOptions opt = options_;
  const int64_t spe = steps_per_epoch_;
  std::shared_ptr<const SampleSet> samples = samples_;
  prefetcher_ = std::make_unique<Prefetcher<Batch>>(
      [=]() -> std::optional<Batch> {
        trace::name_thread("data prefetch");
        const trace::Span span("data", "collate", {"step", cursor->step});
        sampler->set_epoch(cursor->epoch);
        Batch b = collate(*samples, sampler->micro_batch_indices(cursor->step, cursor->micro_step),
                          opt.pin_memory);
        b.epoch = cursor->epoch;
        b.step = cursor->step;
        b.micro_step = cursor->micro_step;
        b.micro_steps = opt.accum_steps;
        b.last_micro_step = cursor->micro_step + 1 == opt.accum_steps;
        *cursor = advance(*cursor, opt.accum_steps, spe);
        return b;
      },
      static_cast<size_t>(options_.prefetch));
}

Batch Loader::next() {
  std::optional<Batch> b = prefetcher_->next();
  if (!b) fail(ErrorKind::kInternal, "training loader ended");
  next_ = advance(next_, options_.accum_steps, steps_per_epoch_);
  return std::move(*b);
}

LoaderState Loader::state() const {
  return next_;
}

ckpt::State Loader::snapshot_state(ckpt::Snapshot) const {
  ckpt::State s;
  s.json = nlohmann::json::parse(loader_state_to_json(state()));
  return s;
}

void Loader::restore_state(const ckpt::StateIn& in) {
  LoaderState st = loader_state_from_json(in.json().dump(), in.origin());
  if (st.global_batch != global_batch_) {
    const int64_t seen = st.step * st.global_batch;
    log::warn("global batch changed from {} to {}: continuing epoch {} after {} samples",
              st.global_batch, global_batch_, st.epoch, seen);
    st.step = seen / global_batch_;
    st.micro_step = 0;
    st.global_batch = global_batch_;
  }
  restore(st);
}

void Loader::restore(const LoaderState& state) {
  start(state);
}

EvalLoader::EvalLoader(std::shared_ptr<const SampleSet> samples, int64_t micro_batch,
                       int64_t world_size, int64_t rank, bool pin_memory, int64_t prefetch)
    : samples_(std::move(samples)), sampler_(samples_->size(), micro_batch, world_size, rank) {
  auto batch = std::make_shared<int64_t>(0);
  const EvalSampler sampler = sampler_;
  std::shared_ptr<const SampleSet> set = samples_;
  prefetcher_ = std::make_unique<Prefetcher<Batch>>(
      [=]() -> std::optional<Batch> {
        trace::name_thread("eval prefetch");
        if (*batch >= sampler.num_batches()) return std::nullopt;
        const trace::Span span("data", "collate", {"batch", *batch});
        Batch b = collate(*set, sampler.batch_indices(*batch), pin_memory);
        b.step = (*batch)++;
        return b;
      },
      static_cast<size_t>(prefetch));
}

EvalLoader::~EvalLoader() = default;

std::optional<Batch> EvalLoader::next() {
  return prefetcher_->next();
}

}  // namespace dstrain::data
