#pragma once
// Per-rank memory of model states (parameters, gradients, fp32 master, optimizer state) for every
// ZeRO stage and offload choice, computed from the parameter shapes alone, with the same layout
// rules as the engine (zero/partition.h, zero/stage3_engine.h), so the numbers are what
// Engine::bytes() measures (padding included; tests/unit/estimate check it). Activations, transient
// communication buffers and the framework's own memory are not part of model states.

#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace dstrain::estimate {

// One trainable tensor: its elements and its stage-3 unit, the model block that owns it
// (model/blocks.h: embedding 0, decoder layer i 1 + i, final norm and untied head L + 1).
struct ParamShape {
  std::string name;
  int64_t numel = 0;
  int unit = 0;
  // The group its placement is cut over (model/placement.h): expert stacks under expert
  // parallelism are sharded over other ranks than the rest.
  model::PlacementGroup group = model::PlacementGroup::kTensor;
};

struct EstimateInput {
  std::vector<ParamShape> params;
  int world_size = 1;
  int compute_bytes = 2;    // bytes per element of parameters and gradients (fp32 4, bf16/fp16 2)
  int optimizer_bytes = 8;  // fp32 state per element: AdamW 8, SGD with momentum 4, SGD 0
  int64_t param_persistence_threshold = 100'000;  // stage 3: smaller tensors stay gathered
};

// Bytes per rank.
struct EstimateRow {
  int stage = 0;
  bool offload_optimizer = false;
  bool offload_param = false;
  int64_t params = 0;     // compute-dtype parameters (stage 3: shard + persistent, gathered)
  int64_t gradients = 0;  // compute dtype
  int64_t master = 0;     // fp32 master (0 where it is the parameter buffer itself)
  int64_t optimizer = 0;  // optimizer state
  int64_t host = 0;       // part of the above in host memory (offload)
  int64_t total() const { return params + gradients + master + optimizer; }
  int64_t device() const { return total() - host; }
};

EstimateRow estimate_row(const EstimateInput& in, int stage, bool offload_optimizer,
                         bool offload_param);
// Stage 0; stages 1 and 2 without and with optimizer offload; stage 3 without offload, with
// optimizer offload, with optimizer and parameter offload.
std::vector<EstimateRow> estimate_all(const EstimateInput& in);

// The trainable tensors of `model` (built without memory), block by block, each block's in the
// order of its weights() (the engines' layout); only those of `blocks` (a pipeline rank's) when it
// is not empty. Their sum over every block is config.num_parameters(true).
std::vector<ParamShape> parameter_shapes(const model::DecoderModelImpl& model,
                                         const std::vector<size_t>& blocks = {});

// A table: one row per estimate_all() entry, sizes in binary units, after a header line that names
// the model, Ψ, the ranks and the dtype.
std::string format_estimate(const EstimateInput& in, const std::string& model_name);

// The same as JSON, for scripts: keys model, parameters, largest_unit (the largest stage-3 unit's
// parameter count), persistent, world_size, compute_bytes, optimizer_bytes and rows: [{stage,
// offload_optimizer, offload_param, params, gradients, master, optimizer, device, host}], bytes
// per rank.
std::string format_estimate_json(const EstimateInput& in, const std::string& model_name);

}  // namespace dstrain::estimate
