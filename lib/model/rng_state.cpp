#include "model/rng_state.h"

#include <mutex>

#include <ATen/Context.h>

namespace dstrain::model {
namespace {

at::Tensor state_of(at::Generator gen) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void restore(at::Generator gen, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

RngState capture_rng(at::TensorList tensors) {
  RngState s;
  s.cpu = state_of(at::globalContext().defaultGenerator(c10::kCPU));
  for (const auto& t : tensors) {
    if (t.defined() && t.is_cuda()) {
      s.device = t.device();
      s.device_state = state_of(at::globalContext().defaultGenerator(*s.device));
      break;
    }
  }
  return s;
}

void restore_rng(const RngState& s) {
  restore(at::globalContext().defaultGenerator(c10::kCPU), s.cpu);
  if (s.device) restore(at::globalContext().defaultGenerator(*s.device), s.device_state);
}

}  // namespace dstrain::model
