#include "train/train_state.h"

#include <mutex>

#include <torch/torch.h>

#include "core/error.h"

namespace dstrain::train {
using nlohmann::json;

namespace {

constexpr const char* kRngTensor = "rng_cpu";

torch::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const torch::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// `key` of a component's JSON, Error(kInput) naming the component when absent or mistyped.
template <typename T>
T state_value(const ckpt::StateIn& in, const char* key) {
  try {
    return in.json().at(key).get<T>();
  } catch (const json::exception& e) {
    fail(ErrorKind::kInput, "{}: {}", in.origin(), e.what());
  }
}

}  // namespace

ckpt::State ProgressState::snapshot_state(ckpt::Snapshot) const {
  ckpt::State s;
  s.json = {{"step", step_}, {"tokens_seen", tokens_seen_}, {"train_loss", train_loss_}};
  if (!micro_batch_auto_.is_null()) s.json["micro_batch_auto"] = micro_batch_auto_;
  s.rank_tensors.emplace_back(kRngTensor, cpu_rng_state());
  return s;
}

void ProgressState::restore_state(const ckpt::StateIn& in) {
  step_ = state_value<int64_t>(in, "step");
  tokens_seen_ = state_value<int64_t>(in, "tokens_seen");
  train_loss_ = state_value<double>(in, "train_loss");
  // A rank the checkpoint did not have (a larger world) keeps its seeded generator.
  const torch::Tensor rng = in.rank_tensor(kRngTensor);
  if (rng.defined()) set_cpu_rng_state(rng);
}

ckpt::State LoraReference::snapshot_state(ckpt::Snapshot) const {
  ckpt::State s;
  s.json = reference_;
  return s;
}

void LoraReference::restore_state(const ckpt::StateIn& in) {
  std::string saved;
  try {
    saved = in.json().at("base").at("checksum").get<std::string>();
  } catch (const json::exception& e) {
    fail(ErrorKind::kInput, "{}: {}", in.origin(), e.what());
  }
  const json& base = reference_.at("base");
  if (saved != base.at("checksum").get<std::string>()) {
    fail(ErrorKind::kInput,
         "{}: holds a LoRA adapter for a base model with checksum {}, but this run's base model "
         "({}) has checksum {}; resume with the same base model",
         in.origin(), saved, base.at("name_or_path").get<std::string>(),
         base.at("checksum").get<std::string>());
  }
}

}  // namespace dstrain::train
