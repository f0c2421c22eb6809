#pragma once
// The AdamW update over raw float arrays, written as plain loops that GCC vectorizes at -O3. This
// file is compiled without LibTorch and with -ffp-contract=off, so the result of an element does
// not depend on whether it fell in a vector body or a scalar tail: any split into chunks (threads)
// gives bit-identical results.

#include <cstdint>

#include "kernels/adamw_cuda.h"

namespace dstrain::optim {

// Per-step constants, in float as ATen uses them for float tensors; the CUDA kernel takes the same.
using AdamWScalars = kernels::AdamWStep;

// For i in [0, n): p *= decay; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
// p -= step_size · m / (sqrt(v)/bias2_sqrt + eps).
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);

}  // namespace dstrain::optim
