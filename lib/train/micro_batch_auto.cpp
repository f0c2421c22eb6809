#include "train/micro_batch_auto.h"

#include <fmt/format.h>

#include "core/bytes.h"
#include "core/error.h"

namespace dstrain::train {
std::vector<int64_t> divisors_descending(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = n; d >= 1; --d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

MicroBatchPlan plan_micro_batch(int64_t samples, const std::function<int64_t(int64_t)>& peak_of,
                                int64_t limit) {
  MicroBatchPlan plan;
  plan.samples = samples;
  plan.limit = limit;
  plan.full_peak = peak_of(samples);
  for (int64_t micro : divisors_descending(samples)) {
    plan.micro = micro;
    plan.peak = micro == samples ? plan.full_peak : peak_of(micro);
    if (plan.peak <= limit) return plan;
  }
  plan.fits = false;  // plan.micro is 1, the last divisor
  return plan;
}

int64_t samples_per_rank(const config::TrainingSection& t) {
  return t.per_device_train_batch_size * t.gradient_accumulation_steps;
}

void apply_micro_batch(config::TrainingSection& t, int64_t micro, int64_t data_parallel) {
  const int64_t samples = samples_per_rank(t);
  if (micro < 1 || samples % micro != 0) {
    fail(ErrorKind::kInternal, "micro-batch auto: {} does not divide the {} samples per rank",
         micro, samples);
  }
  t.per_device_train_batch_size = micro;
  t.gradient_accumulation_steps = samples / micro;
  t.micro_batch_chosen = true;
  t.train_batch_size = samples * data_parallel;
}

std::string describe_plan(const MicroBatchPlan& plan, int64_t data_parallel) {
  std::string line = fmt::format(
      "micro-batch auto: {} × accumulation {} = global {}, {} {} of {} (predicted peak per rank{})",
      plan.micro, plan.accumulation(), plan.samples * data_parallel,
      plan.fits ? "fits in" : "does not fit:", human_bytes(plan.peak, 1),
      human_bytes(plan.limit, 1),
      plan.checkpointing == model::Checkpointing::kNone
          ? ""
          : std::string(" with gradient_checkpointing ") +
                model::checkpointing_word(plan.checkpointing));
  if (plan.memory_bound()) {
    line += fmt::format("; bounded by memory: micro-batch {} (no accumulation) would need {}",
                        plan.samples, human_bytes(plan.full_peak, 1));
  }
  return line;
}

}  // namespace dstrain::train
