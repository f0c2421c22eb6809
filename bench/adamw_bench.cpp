// Times our flat-shard AdamW against torch::optim::AdamW on one 10M-element fp32 shard.
//   adamw_bench [numel] [steps]
// Prints the median milliseconds per step of each, at ATen's current thread count and at 1 thread.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "optim/optimizer.h"

namespace {

double median_ms(int steps, const std::function<void()>& step) {
  step();  // warm-up: first touch of state
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    auto start = std::chrono::steady_clock::now();
    step();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void compare(int64_t numel, int steps) {
  torch::manual_seed(0);
  torch::Tensor grad = torch::randn({numel});
  torch::Tensor ours = torch::randn({numel});
  torch::Tensor theirs = ours.clone().requires_grad_(true);
  theirs.mutable_grad() = grad.clone();

  dstrain::optim::AdamWOptions options;
  options.weight_decay = 0.1;
  auto optimizer = dstrain::optim::make_adamw(numel, options);
  torch::optim::AdamW reference({theirs}, torch::optim::AdamWOptions(1e-3).weight_decay(0.1));

  double ours_ms = median_ms(steps, [&] { optimizer->step(ours, grad, 1e-3); });
  double torch_ms = median_ms(steps, [&] { reference.step(); });
  const double gbytes = numel * 4.0 * 7 / 1e9;  // read p, g, m, v; write p, m, v
  std::printf(
      "threads=%d numel=%lld  dstrain AdamW %.2f ms (%.1f GB/s)  torch::optim::AdamW %.2f ms  "
      "speedup %.2fx\n",
      at::get_num_threads(), static_cast<long long>(numel), ours_ms, gbytes / (ours_ms / 1e3),
      torch_ms, torch_ms / ours_ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t numel = argc > 1 ? std::atoll(argv[1]) : 10'000'000;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  compare(numel, steps);
  if (at::get_num_threads() > 1) {
    at::set_num_threads(1);
    compare(numel, steps);
  }
  return 0;
}
