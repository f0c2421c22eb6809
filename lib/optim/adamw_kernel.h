#pragma once
// The AdamW update over raw float arrays, written as plain loops that GCC vectorizes at -O3. This
// file is compiled without LibTorch and with -ffp-contract=off, so the result of an element does
// not depend on whether it fell in a vector body or a scalar tail: any split into chunks (threads)
// gives bit-identical results.

#include <cstdint>

namespace dstrain::optim {

// Per-step constants, in float as ATen uses them for float tensors.
struct AdamWScalars {
  float beta1 = 0;
  float one_minus_beta1 = 0;
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float eps = 0;
  float decay_factor = 1;  // 1 - lr·weight_decay, or 1 where no decay applies
  float step_size = 0;     // lr / (1 - beta1^t)
  float bias2_sqrt = 1;    // sqrt(1 - beta2^t)
};

// For i in [0, n): p *= decay; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
// p -= step_size · m / (sqrt(v)/bias2_sqrt + eps).
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);

}  // namespace dstrain::optim
