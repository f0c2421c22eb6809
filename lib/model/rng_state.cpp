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

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void reseed(at::Generator gen, uint64_t seed) {
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_current_seed(seed);
}

}  // namespace

uint64_t draw_key(std::initializer_list<uint64_t> parts) {
  uint64_t key = 0x9e3779b97f4a7c15ULL;
  for (uint64_t part : parts) key = mix(key + 0x9e3779b97f4a7c15ULL + part);
  return key;
}

void seed_rng(uint64_t seed, at::TensorList tensors) {
  reseed(at::globalContext().defaultGenerator(c10::kCPU), seed);
  for (const auto& t : tensors) {
    if (t.defined() && t.is_cuda()) {
      reseed(at::globalContext().defaultGenerator(t.device()), seed);
      break;
    }
  }
}

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
