#pragma once
// The first-use check of the fused paths (fused_layer_ops.h, fused_qkv.h): before a run's first
// step, each fused path runs once on the run's device, in its compute dtype and at its layer
// shapes, beside the eager ops it replaces, forward and backward from the same seeded inputs and
// output gradients, and both are held to the exact answer (the same formulas in float64 from the
// same rounded inputs). A path passes when, for every output and gradient,
//   max |fused - exact|  <=  2 · max |eager - exact|  +  4 · eps(dtype) · max |exact|
// (eps: 2^-23 for float32, 2^-7 for bfloat16): the fused path may round differently, never
// worse than twice what the eager ops already lose, plus a few units in the last place. A kernel
// miscompiled for the card, a launch configuration wrong at the run's sizes or a race shows as
// an error far above that bound; a path that fails is switched off for the process
// (set_fused_path_on) and its eager ops run in its place. The trainer agrees the result over the
// ranks first (train/fused_check.h), so every rank takes the same paths.
//
// Each tensor holds at most kCheckElements elements (the rows are cut to fit), so the check costs
// a few MB and milliseconds even for an 8B model's MLP.

#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "model/fused_layer_ops.h"

namespace dstrain::model {

inline constexpr int64_t kCheckElements = int64_t{1} << 25;

// The shapes and numbers of one run's decoder layers.
struct FusedCheckShapes {
  int64_t rows = 0;     // tokens of one micro-batch (batch × sequence)
  int64_t seq_len = 0;  // tokens of one sequence (the rotary tables' length)
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  bool qkv_bias = false;
  int64_t sliding_window = 0;  // the model's attention window (0: none)
  int64_t experts = 0;         // a MoE model's experts per layer (0: a dense model)
  int64_t expert_size = 0;     // and each expert's width
  double eps = 1e-6;
  torch::ScalarType dtype = torch::kFloat;
  torch::Device device = torch::kCPU;
};

// For tests: every output and gradient of `path`'s fused run is scaled by (1 + ulps · eps(dtype))
// before the comparison, as a kernel wrong by that many units in the last place would be.
struct PlantedFault {
  FusedPath path = FusedPath::kAddRmsNorm;
  double ulps = 100;
};

struct FusedCheck {
  FusedPath path = FusedPath::kAddRmsNorm;
  bool passed = false;
  double error = 0;    // max |fused - exact| of the worst tensor (the largest error / bound)
  double bound = 0;    // that tensor's bound
  std::string tensor;  // its name, e.g. "d weight"
  int64_t rows = 0;    // the rows it ran with
};

// The gap between 1 and the next number of `t` (2^-23 float32, 2^-7 bfloat16, 2^-10 float16).
double dtype_eps(torch::ScalarType t);

// One check per fused path, in FusedPath's order. On the CPU the CUDA kernels' float32
// references stand in for the kernels (float32 only), so the tests run the same comparison; for
// packed documents' attention the dense block-diagonal masked SDPA stands in for FlashAttention's
// variable-length kernels, which run in bfloat16 and float16 only (another dtype on a GPU: the
// path is not used, and its check says so). The grouped expert product (moe.h) runs over rows
// spread unevenly over the experts, one of them getting none, against the per-expert loop; at
// most as many experts as the element budget takes (at least 2); a dense model, and on a GPU a
// dtype other than bfloat16, do not use it.
std::vector<FusedCheck> check_fused_paths(const FusedCheckShapes& shapes,
                                          const std::optional<PlantedFault>& fault = {});

}  // namespace dstrain::model
