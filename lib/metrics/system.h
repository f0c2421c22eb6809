#pragma once
// Process-level figures for metrics: host memory and the model FLOPs utilisation formula.

#include <cstdint>

namespace dstrain::metrics {

// Resident set size of this process now, and its peak so far, in bytes (Linux /proc, getrusage).
int64_t current_rss_bytes();
int64_t peak_rss_bytes();

// Model FLOPs utilisation: achieved model FLOP/s over the hardware peak. Returns 0 when the peak is
// unknown (<= 0), e.g. on CPU unless DSTRAIN_PEAK_FLOPS is set.
double mfu(double flops_per_token, double tokens_per_second, double peak_flops);

// Peak FLOP/s from DSTRAIN_PEAK_FLOPS (e.g. "989e12"), else `fallback`.
double peak_flops_from_env(double fallback);

}  // namespace dstrain::metrics
