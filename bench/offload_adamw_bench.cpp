// The CPU side of optimizer offload: how close our AdamW on a large fp32 shard comes to the
// machine's memory bandwidth, and how it compares with torch::optim::AdamW on the same tensors.
//   offload_adamw_bench [numel] [steps]     (default 50M elements: 200 MB per fp32 array)
// Prints, at ATen's thread count: STREAM-style copy (a = b, 8 bytes/elem moved), triad
// (a = b + s·c, 12 bytes/elem) and the in-place a += s·b (12 bytes/elem; like AdamW it rewrites
// what it read, so no write-allocate traffic: the fairest ceiling for an in-place optimizer) in
// GB/s, then ms per step, effective GB/s and percent of the in-place bandwidth of
//   dstrain AdamW         reads p, g, m, v and writes p, m, v: 28 bytes/elem
//   torch::optim::AdamW   the same tensors (its own state)
//   offload step          what step() does on the host with bf16 compute: bf16 gradient → fp32,
//                         AdamW, fp32 master → bf16 parameters (+ 2 + 4 + 4 + 2 bytes/elem)
// Median of `steps` timed runs after one warm-up.

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

double median_s(int steps, const std::function<void()>& run) {
  run();
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// STREAM kernels over raw fp32 arrays, split across ATen's threads (first touch by the same split).
enum class Kernel { kCopy, kTriad, kAxpy };

double stream_gbs(int64_t n, int steps, Kernel kernel) {
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n)),
      c(static_cast<size_t>(n));
  at::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      a[i] = 0.f;
      b[i] = 1.f;
      c[i] = 2.f;
    }
  });
  const float s = 3.f;
  const double t = median_s(steps, [&] {
    at::parallel_for(0, n, 1 << 16, [&](int64_t lo, int64_t hi) {
      float* __restrict pa = a.data();
      const float* __restrict pb = b.data();
      const float* __restrict pc = c.data();
      if (kernel == Kernel::kTriad) {
        for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i] + s * pc[i];
      } else if (kernel == Kernel::kAxpy) {
        for (int64_t i = lo; i < hi; ++i) pa[i] += s * pb[i];
      } else {
        for (int64_t i = lo; i < hi; ++i) pa[i] = pb[i];
      }
    });
  });
  if (a[static_cast<size_t>(n / 2)] < 0) std::printf("?");  // keep the loops
  return (kernel == Kernel::kCopy ? 8.0 : 12.0) * static_cast<double>(n) / t / 1e9;
}

void report(const char* what, double seconds, double bytes_per_elem, int64_t n, double ceiling) {
  const double gbs = bytes_per_elem * static_cast<double>(n) / seconds / 1e9;
  std::printf("%-22s %9.2f ms  %7.1f GB/s  %5.0f%% of in-place\n", what, seconds * 1e3, gbs,
              100.0 * gbs / ceiling);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 50'000'000;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 10;
  torch::NoGradGuard no_grad;
  std::printf("threads=%d numel=%lld steps=%d\n", at::get_num_threads(), static_cast<long long>(n),
              steps);
  const double copy = stream_gbs(n, steps, Kernel::kCopy);
  const double triad = stream_gbs(n, steps, Kernel::kTriad);
  const double axpy = stream_gbs(n, steps, Kernel::kAxpy);
  std::printf("%-22s %9s     %7.1f GB/s\n", "stream copy", "", copy);
  std::printf("%-22s %9s     %7.1f GB/s\n", "stream triad", "", triad);
  std::printf("%-22s %9s     %7.1f GB/s\n", "in-place a += s*b", "", axpy);

  torch::manual_seed(0);
  const torch::Tensor grad = torch::randn({n});
  torch::Tensor master = torch::randn({n});
  dstrain::optim::AdamWOptions options;
  options.weight_decay = 0.1;
  auto ours = dstrain::optim::make_adamw(n, options);
  report("dstrain AdamW", median_s(steps, [&] { ours->step(master, grad, 1e-4); }), 28, n, axpy);

  torch::Tensor param = master.clone();
  param.mutable_grad() = grad.clone();
  torch::optim::AdamW theirs({param}, torch::optim::AdamWOptions(1e-4).weight_decay(0.1));
  report("torch::optim::AdamW", median_s(steps, [&] { theirs.step(); }), 28, n, axpy);

  const torch::Tensor grad16 = grad.to(torch::kBFloat16);
  torch::Tensor param16 = master.to(torch::kBFloat16);
  auto offloaded = dstrain::optim::make_adamw(n, options);
  report("offload step (bf16)",
         median_s(steps,
                  [&] {
                    torch::Tensor g32 = grad16.to(torch::kFloat32);
                    offloaded->step(master, g32, 1e-4);
                    param16.copy_(master);
                  }),
         28 + 2 + 4 + 4 + 2, n, axpy);
  return 0;
}
