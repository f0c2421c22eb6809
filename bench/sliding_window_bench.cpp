// One forward+backward of causal attention limited to a sliding window, three ways: tiled
// (model/sliding_window_attention.h), SDPA with the dense [T, T] band mask (what a mask-based
// implementation holds), and plain causal SDPA over the whole sequence (no window, for scale).
//   sliding_window_bench [T] [window] [heads] [head_dim] [runs] [float32|bfloat16]
// Defaults: T 8192, window 1024, 8 heads of 64, batch 1, 3 runs, float32. Prints per path the
// peak bytes LibTorch's CPU allocator held during the pass above what was held before it (q, k,
// v themselves not counted; their gradients are) and the median wall and process CPU time.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "model/sliding_window_attention.h"
#include "tests/unit/model/counting_allocator.h"

namespace {

using dstrain::model::testing::CountingAllocator;

struct Measure {
  int64_t peak_bytes = 0;
  double median_ms = 0;      // wall time
  double median_cpu_ms = 0;  // process CPU time: steadier than wall time on a shared machine
};

// Runs `pass` `runs` times (after one warm-up), each after `clear` and with the allocator's peak
// reset.
Measure measure(CountingAllocator& counter, int runs, const std::function<void()>& clear,
                const std::function<void()>& pass) {
  clear();
  pass();
  Measure m;
  std::vector<double> times, cpu_times;
  for (int i = 0; i < runs; ++i) {
    clear();
    counter.reset_peak();
    const int64_t before = counter.current();
    const auto start = std::chrono::steady_clock::now();
    const std::clock_t cpu_start = std::clock();
    pass();
    cpu_times.push_back(1000.0 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC);
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    m.peak_bytes = std::max(m.peak_bytes, counter.peak() - before);
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu_times.begin(), cpu_times.end());
  m.median_ms = times[times.size() / 2];
  m.median_cpu_ms = cpu_times[cpu_times.size() / 2];
  return m;
}

void report(const char* name, const Measure& m) {
  std::printf("%-22s peak %9.1f MiB   wall %9.1f ms   cpu %9.1f ms\n", name,
              static_cast<double>(m.peak_bytes) / (1 << 20), m.median_ms, m.median_cpu_ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 8192;
  const int64_t window = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int64_t heads = argc > 3 ? std::atoll(argv[3]) : 8;
  const int64_t head_dim = argc > 4 ? std::atoll(argv[4]) : 64;
  const int runs = argc > 5 ? std::atoi(argv[5]) : 3;
  const std::string dtype_name = argc > 6 ? argv[6] : "float32";
  const auto dtype = dtype_name == "bfloat16" ? torch::kBFloat16 : torch::kFloat;

  dstrain::model::testing::CountingScope scope;
  CountingAllocator& counter = scope.counter();
  torch::manual_seed(0);
  auto input = [&] { return torch::randn({1, heads, T, head_dim}).to(dtype).requires_grad_(); };
  const torch::Tensor q = input(), k = input(), v = input();
  auto clear = [&] {
    for (const torch::Tensor& t : {q, k, v}) t.mutable_grad() = torch::Tensor();
  };
  std::printf("T %lld, window %lld, %lld heads x %lld, %s, %d threads\n", static_cast<long long>(T),
              static_cast<long long>(window), static_cast<long long>(heads),
              static_cast<long long>(head_dim), dtype_name.c_str(), at::get_num_threads());
  report("tiled window", measure(counter, runs, clear, [&] {
           dstrain::model::sliding_window_attention(q, k, v, window).sum().backward();
         }));
  report("dense band mask", measure(counter, runs, clear, [&] {
           const torch::Tensor i = torch::arange(T).unsqueeze(1), j = torch::arange(T).unsqueeze(0);
           const torch::Tensor mask = j.le(i) & j.gt(i - window);
           at::scaled_dot_product_attention(q, k, v, mask).sum().backward();
         }));
  report("causal, no window", measure(counter, runs, clear, [&] {
           at::scaled_dot_product_attention(q, k, v, {}, 0.0, true).sum().backward();
         }));
  return 0;
}
