#include "train/fused_check.h"

#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "core/log.h"
#include "core/timer.h"
#include "model/model.h"
#include "train/step_sync.h"

namespace dstrain::train {

namespace {
constexpr int64_t kFields = 3;  // passed, error, bound
}  // namespace

std::vector<FusedPathVerdict> agree_fused_checks(comm::Communicator& comm,
                                                 const std::vector<model::FusedCheck>& mine,
                                                 const torch::Device& device) {
  const auto n = static_cast<int64_t>(mine.size());
  torch::Tensor local = torch::empty({n, kFields}, torch::kDouble);
  for (int64_t p = 0; p < n; ++p) {
    local[p][0] = mine[p].passed ? 1.0 : 0.0;
    local[p][1] = mine[p].error;
    local[p][2] = mine[p].bound;
  }
  const int world = comm.world_size();
  const torch::Tensor all = gather_from_ranks(comm, local, device);
  std::vector<FusedPathVerdict> verdicts;
  for (int64_t p = 0; p < n; ++p) {
    FusedPathVerdict v;
    v.path = mine[p].path;
    double worst = -1;
    for (int r = 0; r < world; ++r) {
      if (all[r][p][0].item<double>() != 0.0) continue;
      v.on = false;
      v.failed_ranks.push_back(r);
      const double error = all[r][p][1].item<double>(), bound = all[r][p][2].item<double>();
      const double ratio = bound > 0 ? error / bound : error;
      if (ratio > worst || std::isnan(error)) {
        worst = ratio;
        v.error = error;
        v.bound = bound;
        v.tensor = r == comm.rank() ? mine[p].tensor : "";
      }
    }
    verdicts.push_back(std::move(v));
  }
  return verdicts;
}

std::string describe_verdict(const FusedPathVerdict& v) {
  if (v.on) return "";
  return fmt::format(
      "the fused {} differs from the eager ops on rank(s) {}: max error {:.3g}{} against a bound "
      "of {:.3g}; every rank runs the eager ops in its place for this run",
      model::fused_path_name(v.path), fmt::join(v.failed_ranks, ", "), v.error,
      v.tensor.empty() ? "" : " (" + v.tensor + ")", v.bound);
}

std::vector<FusedPathVerdict> check_fused_kernels(comm::Communicator& comm,
                                                  const model::FusedCheckShapes& shapes,
                                                  const std::optional<model::PlantedFault>& fault) {
  const Stopwatch timer;
  const std::vector<model::FusedCheck> mine = model::check_fused_paths(shapes, fault);
#if defined(DSTRAIN_CUDA) && DSTRAIN_CUDA
  // The check's float64 tensors (a few hundred MB at most) go back to the device rather than stay
  // in the caching allocator's reserve, out of reach of NCCL and of what the run plans.
  if (shapes.device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  std::vector<FusedPathVerdict> verdicts = agree_fused_checks(comm, mine, shapes.device);
  int off = 0;
  for (const FusedPathVerdict& v : verdicts) {
    model::set_fused_path_on(v.path, v.on);
    if (!v.on) {
      ++off;
      if (comm.rank() == 0) log::warn("{}", describe_verdict(v));
    }
  }
  if (comm.rank() == 0) {
    log::info(
        "fused kernels checked against the eager ops on every rank's device ({}, up to {} rows): "
        "{} of {} in use ({:.2f} s)",
        model::dtype_name(shapes.dtype), shapes.rows, verdicts.size() - off, verdicts.size(),
        timer.seconds());
  }
  return verdicts;
}

void check_fused_kernels_for_run(comm::Communicator& comm, const model::ModelConfig& model,
                                 int64_t rows, int64_t seq_len, torch::ScalarType dtype,
                                 const torch::Device& device) {
  if (!model::use_fused_kernels(
          torch::empty({0}, torch::TensorOptions().dtype(dtype).device(device)))) {
    return;
  }
  model::FusedCheckShapes s;
  s.rows = rows;
  s.seq_len = seq_len;
  s.hidden = model.hidden_size;
  s.intermediate = model.intermediate_size;
  s.heads = model.num_attention_heads;
  s.kv_heads = model.num_key_value_heads;
  s.head_dim = model.head_dim;
  s.qkv_bias = model.qkv_bias;
  s.sliding_window = model.sliding_window.value_or(0);
  s.experts = model.moe.experts;
  s.expert_size = model.moe.expert_size;
  s.eps = model.rms_norm_eps;
  s.dtype = dtype;
  s.device = device;
  check_fused_kernels(comm, s);
}

}  // namespace dstrain::train
