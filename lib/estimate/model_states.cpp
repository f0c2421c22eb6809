#include "estimate/model_states.h"

#include <algorithm>

#include <fmt/format.h>
#include <map>
#include <nlohmann/json.hpp>

#include "core/bytes.h"

namespace dstrain::estimate {
namespace {

// Stage 3: elements of this rank's shard (every unit padded to a multiple of N, the persistent
// tensors forming one more unit) and elements of the persistent unit, gathered for good.
struct Stage3Layout {
  int64_t shard = 0;
  int64_t persistent = 0;
};

Stage3Layout stage3_layout(const EstimateInput& in) {
  int units = 0;
  for (const ParamShape& p : in.params) units = std::max(units, p.unit + 1);
  std::vector<int64_t> numel(static_cast<size_t>(units) + 1, 0);
  for (const ParamShape& p : in.params) {
    const bool small = p.numel < in.param_persistence_threshold;
    numel[small ? static_cast<size_t>(units) : static_cast<size_t>(p.unit)] += p.numel;
  }
  Stage3Layout layout;
  for (int64_t n : numel) layout.shard += round_up(n, in.world_size) / in.world_size;
  layout.persistent = round_up(numel.back(), in.world_size);
  return layout;
}

}  // namespace

std::vector<ParamShape> parameter_shapes(const model::DecoderModelImpl& model,
                                         const std::vector<size_t>& blocks) {
  std::vector<ParamShape> out;
  for (const auto& block : model.blocks()) {
    if (!blocks.empty() && std::find(blocks.begin(), blocks.end(), block->index) == blocks.end()) {
      continue;
    }
    for (const model::BlockParameter& p : block->parameters) {
      out.push_back({p.name, p.tensor.numel(), static_cast<int>(block->index), p.placement.group});
    }
  }
  return out;
}

EstimateRow estimate_row(const EstimateInput& in, int stage, bool offload_optimizer,
                         bool offload_param) {
  int64_t psi = 0;
  for (const ParamShape& p : in.params) psi += p.numel;
  const int64_t n = in.world_size;
  const int64_t padded = round_up(psi, n);
  const int64_t cb = in.compute_bytes;
  EstimateRow r{stage, offload_optimizer, offload_param};
  if (stage < 3) {
    const int64_t master = stage == 0 ? padded : padded / n;
    r.params = cb * padded;
    // Stage 2 offloading the optimizer: the gradient shard is fp32 on the host.
    const bool host_grads = stage == 2 && offload_optimizer;
    r.gradients = stage < 2 ? cb * padded : (host_grads ? 4 : cb) * (padded / n);
    // Stage 0 in fp32: the master is the parameter buffer itself.
    r.master = stage == 0 && cb == 4 ? 0 : 4 * master;
    r.optimizer = in.optimizer_bytes * master;
    if (offload_optimizer) r.host = r.master + r.optimizer + (host_grads ? r.gradients : 0);
    return r;
  }
  const Stage3Layout layout = stage3_layout(in);
  r.params = cb * (layout.shard + layout.persistent);
  // Offloading the optimizer, the gradient shard is fp32 on the host (streamed there in backward).
  r.gradients = (offload_optimizer ? 4 : cb) * layout.shard;
  // fp32 compute with master and parameters in the same memory: the shard is the master.
  r.master = cb == 4 && offload_param == offload_optimizer ? 0 : 4 * layout.shard;
  r.optimizer = in.optimizer_bytes * layout.shard;
  if (offload_optimizer) r.host += r.master + r.optimizer + r.gradients;
  if (offload_param) r.host += cb * layout.shard;
  return r;
}

std::vector<EstimateRow> estimate_all(const EstimateInput& in) {
  return {estimate_row(in, 0, false, false), estimate_row(in, 1, false, false),
          estimate_row(in, 1, true, false),  estimate_row(in, 2, false, false),
          estimate_row(in, 2, true, false),  estimate_row(in, 3, false, false),
          estimate_row(in, 3, true, false),  estimate_row(in, 3, true, true)};
}

std::string format_estimate(const EstimateInput& in, const std::string& model_name) {
  int64_t psi = 0;
  int64_t persistent = 0;
  for (const ParamShape& p : in.params) {
    psi += p.numel;
    if (p.numel < in.param_persistence_threshold) persistent += p.numel;
  }
  std::string out = fmt::format(
      "Model states per rank for {}: {} trainable parameters, {} ranks, {}-byte parameters and "
      "gradients, {} bytes of optimizer state per parameter; stage 3 keeps {} parameters (those "
      "in tensors under {} elements) gathered on every rank.\n\n",
      model_name, psi, in.world_size, in.compute_bytes, in.optimizer_bytes, persistent,
      in.param_persistence_threshold);
  out += fmt::format("{:<6}{:<19}{:>12}{:>12}{:>12}{:>12}{:>12}{:>12}\n", "stage", "offload",
                     "params", "gradients", "master", "optimizer", "device", "host");
  for (const EstimateRow& r : estimate_all(in)) {
    const std::string offload = r.offload_param       ? "optimizer+param"
                                : r.offload_optimizer ? "optimizer"
                                                      : "none";
    out += fmt::format("{:<6}{:<19}{:>12}{:>12}{:>12}{:>12}{:>12}{:>12}\n", r.stage, offload,
                       human_bytes(r.params), human_bytes(r.gradients), human_bytes(r.master),
                       human_bytes(r.optimizer), human_bytes(r.device()), human_bytes(r.host));
  }
  out +=
      "\nNot included: activations (dstrain estimate prints them below), transient communication "
      "buffers, the CUDA context and allocator caching.\n";
  return out;
}

std::string format_estimate_json(const EstimateInput& in, const std::string& model_name) {
  int64_t psi = 0;
  int64_t persistent = 0;
  std::map<int, int64_t> units;
  for (const ParamShape& p : in.params) {
    psi += p.numel;
    units[p.unit] += p.numel;
    if (p.numel < in.param_persistence_threshold) persistent += p.numel;
  }
  int64_t largest_unit = 0;
  for (const auto& [unit, numel] : units) largest_unit = std::max(largest_unit, numel);
  nlohmann::json rows = nlohmann::json::array();
  for (const EstimateRow& r : estimate_all(in)) {
    rows.push_back({{"stage", r.stage},
                    {"offload_optimizer", r.offload_optimizer},
                    {"offload_param", r.offload_param},
                    {"params", r.params},
                    {"gradients", r.gradients},
                    {"master", r.master},
                    {"optimizer", r.optimizer},
                    {"device", r.device()},
                    {"host", r.host}});
  }
  const nlohmann::json out = {{"model", model_name},
                              {"parameters", psi},
                              {"largest_unit", largest_unit},
                              {"persistent", persistent},
                              {"world_size", in.world_size},
                              {"compute_bytes", in.compute_bytes},
                              {"optimizer_bytes", in.optimizer_bytes},
                              {"rows", rows}};
  return out.dump(2) + "\n";
}

}  // namespace dstrain::estimate
