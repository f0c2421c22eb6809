// One forward+backward of an LM head and its cross-entropy loss, unfused (logits [N, V], then
// the loss) against fused (model/fused_linear_cross_entropy.h), in float32 and bfloat16.
//   fused_loss_bench [tokens] [hidden] [vocab] [runs] [chunk_mib] [float32|bfloat16]
// Defaults: the Qwen2.5-0.5B head (hidden 896, vocab 151936) at 2048 tokens, 5 runs, the default
// chunk budget, both dtypes. Prints, per dtype and path, the peak bytes LibTorch's CPU allocator
// held during the pass above what was held before it (the weight and hidden state themselves are
// not counted; the gradients are), and the median wall time of the runs.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "model/fused_linear_cross_entropy.h"
#include "model/model.h"
#include "tests/unit/model/counting_allocator.h"

namespace {

using dstrain::model::testing::CountingAllocator;

struct Measure {
  int64_t peak_bytes = 0;
  double median_ms = 0;
};

// Runs `pass` `runs` times (after one warm-up), each with the allocator's peak reset first.
Measure measure(CountingAllocator& counter, int runs, const std::function<void()>& pass) {
  pass();
  Measure m;
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    counter.reset_peak();
    const int64_t before = counter.current();
    const auto start = std::chrono::steady_clock::now();
    pass();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    m.peak_bytes = std::max(m.peak_bytes, counter.peak() - before);
  }
  std::sort(times.begin(), times.end());
  m.median_ms = times[times.size() / 2];
  return m;
}

void compare(CountingAllocator& counter, torch::ScalarType dtype, int64_t tokens, int64_t hidden,
             int64_t vocab, int runs, int64_t chunk_bytes) {
  torch::manual_seed(0);
  const torch::Tensor h = (torch::randn({tokens, hidden})).to(dtype).requires_grad_(true);
  const torch::Tensor w = (torch::randn({vocab, hidden}) * 0.02).to(dtype).requires_grad_(true);
  const torch::Tensor labels = torch::randint(0, vocab, {tokens}, torch::kLong);
  auto clear = [&] {
    h.mutable_grad() = torch::Tensor();
    w.mutable_grad() = torch::Tensor();
  };
  const Measure unfused = measure(counter, runs, [&] {
    dstrain::model::causal_lm_loss(torch::nn::functional::linear(h, w), labels).backward();
    clear();
  });
  const Measure fused = measure(counter, runs, [&] {
    const dstrain::model::LossSum s{dstrain::model::linear_cross_entropy_sum(
                                        h, w, labels, dstrain::model::kIgnoreIndex, chunk_bytes),
                                    labels.ne(dstrain::model::kIgnoreIndex).sum()};
    s.mean().backward();
    clear();
  });
  const double mib = 1024.0 * 1024.0;
  std::printf(
      "%-8s tokens=%lld hidden=%lld vocab=%lld chunk=%lld tokens  unfused: peak %.0f MiB, %.0f ms"
      "  fused: peak %.0f MiB, %.0f ms  (peak %.1fx smaller, time %.2fx)\n",
      c10::toString(dtype), static_cast<long long>(tokens), static_cast<long long>(hidden),
      static_cast<long long>(vocab),
      static_cast<long long>(dstrain::model::loss_chunk_tokens(vocab, chunk_bytes)),
      static_cast<double>(unfused.peak_bytes) / mib, unfused.median_ms,
      static_cast<double>(fused.peak_bytes) / mib, fused.median_ms,
      static_cast<double>(unfused.peak_bytes) / static_cast<double>(fused.peak_bytes),
      fused.median_ms / unfused.median_ms);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 2048;
  const int64_t hidden = argc > 2 ? std::atoll(argv[2]) : 896;
  const int64_t vocab = argc > 3 ? std::atoll(argv[3]) : 151936;
  const int runs = argc > 4 ? std::atoi(argv[4]) : 5;
  const int64_t chunk_bytes =
      argc > 5 ? std::atoll(argv[5]) << 20 : dstrain::model::kDefaultLossChunkBytes;
  const std::string only = argc > 6 ? argv[6] : "";
  dstrain::model::testing::CountingScope scope;
  std::printf("threads=%d\n", at::get_num_threads());
  for (torch::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    if (!only.empty() && only != dstrain::model::dtype_name(dtype)) continue;
    compare(scope.counter(), dtype, tokens, hidden, vocab, runs, chunk_bytes);
  }
  return 0;
}
