#pragma once
// The Mixture-of-Experts MLP of qwen2_moe, qwen3_moe and mixtral layers (model.layers.N.mlp), as
// transformers 5 computes it, dropless (every token reaches its top_k experts, none is dropped):
//
//   router     logits = x · gateᵀ [N, E] in x's dtype (float32 where MoeConfig::float32_router
//              asks); probabilities = softmax in float32; the
//              top_k of them per token (torch.topk's order), renormalised to sum 1 where
//              norm_topk_prob (Mixtral: always); Qwen casts the weights back to the logits' dtype,
//              Mixtral keeps them in float32
//   experts    the N·top_k (token, expert) pairs sorted by expert once, then one grouped matrix
//              product per projection over the sorted rows (at::_grouped_mm, whose offsets mark
//              where each expert's rows end): gate_up = rows · gate_up_projᵀ [.., 2I], the SwiGLU
//              of its halves (gate first), then · down_projᵀ; each row scaled by its weight, cast
//              to x's dtype, put back in token order and summed over the token's k rows (a
//              gather and a sum, whose backward keeps nothing of the rows; index_add would keep
//              them all)
//   shared     qwen2_moe: a dense MLP on every token, scaled by sigmoid(x · shared_expert_gateᵀ),
//              added to the experts' sum
//
// Parameters under transformers 5's names: gate.weight [E, C], experts.gate_up_proj [E, 2I, C]
// (each expert's gate_proj rows, then its up_proj rows), experts.down_proj [E, C, I], and for
// qwen2_moe shared_expert.{gate,up,down}_proj.weight and shared_expert_gate.weight [1, C]. The
// Hub's per-expert files (experts.N.gate_proj ..., Mixtral's block_sparse_moe.experts.N.w1/w3/w2)
// are converted to these when read and back when written (expert_names.h).
//
// In training each forward's MoE layers report to one RouterRecord (below): every layer its
// experts' load, and where the router's losses are on, what they are computed from.
//
// Expert parallelism (ExpertParallel, below): each rank of a group of P holds E/P of the experts
// (rank r experts [r·E/P, (r+1)·E/P), their stacks [E/P, ...]); the router runs on every rank
// over its own tokens, and the sorted rows, already grouped by the rank holding their expert, go
// there: the ranks first exchange their rows' counts per expert (one host synchronisation per
// layer, as Megatron-LM's all-to-all dispatcher), then the rows (all_to_all_v); each rank sorts
// what it received by its local experts, runs them as above, and sends the results back the way
// the rows came, where they are weighted and summed as without it. Dropless: a rank receives
// whatever was routed to its experts. The backward mirrors both exchanges.
//
// The grouped product runs where the rows and weights meet at::_grouped_mm's alignment (its
// strides multiples of 16 bytes): on the CPU, and on a GPU in bfloat16 where the fused paths run
// (FusedPath::kGroupedExperts, checked on the card against the loop before the first step and
// switched off where it differs: kernel_check.h); elsewhere one product per expert over its rows,
// the same sums.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/custom_class.h>
#include <torch/torch.h>

#include "model/layers.h"
#include "model/model_config.h"

namespace dstrain::model {

// Something added to an expert stack's products, computed from the same rows: LoRA on the experts
// (lib/lora). rows [M, in] sorted by expert, `ends` and `grouped` as for expert_linear (below) →
// [M, out] in the rows' dtype. The model never creates adapters (as LinearImpl::adapter).
class ExpertsAdapter {
 public:
  virtual ~ExpertsAdapter() = default;
  virtual torch::Tensor delta(const torch::Tensor& rows, const torch::Tensor& ends,
                              bool grouped) = 0;
};

// rows [M, in] sorted by expert, `ends` [E] int32 the end of each expert's rows (the last M) →
// [M, out]: each row · weight[e]ᵀ, weight [E, out, in], e the row's expert. `grouped`: one
// at::_grouped_mm where the operands are aligned for it; else (and otherwise) one product per
// expert.
torch::Tensor expert_linear(const torch::Tensor& rows, const torch::Tensor& weight,
                            const torch::Tensor& ends, bool grouped);
// The experts' SwiGLU MLP over sorted rows: down(silu(gate(row)) · up(row)) of each row's expert,
// gate_up [E, 2I, C] (gate rows first), down [E, C, I]; `grouped` as for expert_linear. The
// adapters (null: none) add their deltas to the two products.
torch::Tensor experts_mlp(const torch::Tensor& rows, const torch::Tensor& gate_up,
                          const torch::Tensor& down, const torch::Tensor& ends, bool grouped,
                          ExpertsAdapter* gate_up_adapter = nullptr,
                          ExpertsAdapter* down_adapter = nullptr);
// Whether the experts take the grouped product for `rows` (the header's rule, alignment aside).
bool grouped_experts_on(const torch::Tensor& rows);

// The experts' weights: transformers 5's Qwen3MoeExperts / MixtralExperts.
class ExpertsImpl : public torch::nn::Module {
 public:
  ExpertsImpl(int64_t experts, int64_t hidden, int64_t width, Materialize materialize);
  // rows [M, C] sorted by expert, `ends` [E] int32 the end of each expert's rows (the last one M)
  // → [M, C]: down(silu(gate(row)) · up(row)) of each row's expert.
  torch::Tensor forward(const torch::Tensor& rows, const torch::Tensor& ends);

  // The stack named `parameter` ("gate_up_proj" or "down_proj") and its adapter's slot (null:
  // none; whoever sets one keeps its parameters, as for LinearImpl::adapter).
  torch::Tensor stack(const std::string& parameter) const;
  std::shared_ptr<ExpertsAdapter>& adapter(const std::string& parameter);

  torch::Tensor gate_up_proj;  // [E, 2I, C]
  torch::Tensor down_proj;     // [E, C, I]
  std::shared_ptr<ExpertsAdapter> gate_up_adapter, down_adapter;
};
TORCH_MODULE(Experts);

// A micro-batch's router statistics over the MoE layers one rank ran of it, pooled: what the
// router's losses are computed from (router_losses), and, summed over the ranks that hold parts
// of one micro-batch's tokens (sequence parallelism), the whole micro-batch's.
struct RouterTotals {
  torch::Tensor counts;  // [E] float32: (token, expert) choices per expert, padding excluded
  // [E + 1] float32, differentiable: each expert's routing probabilities summed over the tokens
  // and layers, then the sum of logsumexp(router logits)² over them (the z-loss's)
  torch::Tensor sums;
  torch::Tensor rows;  // float32 scalar: tokens × layers summed over
  bool defined() const { return counts.defined(); }
};

// The load-balancing loss as transformers' load_balancing_loss_func computes it from the pooled
// totals (E · Σₑ countsₑ/rows · probabilityₑ/rows), and ST-MoE's router z-loss (the mean of
// logsumexp(logits)² over the tokens and layers).
struct RouterLosses {
  torch::Tensor aux;
  torch::Tensor z;
  // What a micro-batch's loss adds: aux_loss_coef · aux where `moe.aux_loss`, z_loss_coef · z
  // where that is not 0.
  torch::Tensor weighted(const MoeConfig& moe) const;
};
RouterLosses router_losses(const RouterTotals& totals);

// What one forward's MoE layers report in training (BlockContext::router): each layer its
// experts' load (every (token, expert) choice, padding included: the work done), and where the
// router's losses are on, the statistics of RouterTotals over its real tokens. A checkpointed
// layer's recompute reports the same again, which replaces the first report.
//
// The losses' gradient reaches the routers without the layers' graphs being kept until the loss
// exists (checkpointing drops them): totals() returns the pooled sums as a node downstream of the
// forward's last output, whose backward (run before any layer's) keeps the gradient of the sums;
// each layer's output carries a node whose backward hands the layer's own sums that gradient (the
// totals are their sum).
class RouterRecord : public torch::CustomClassHolder {
 public:
  RouterRecord(int64_t layers, bool losses);  // `layers`: the model's MoE layers
  bool losses() const { return losses_; }
  // Layer `slot` (ModelConfig::moe_layer_slot): `load` [E] its choices per expert, and with the
  // losses its RouterTotals (`sums` as computed, the node is added to `output`, which is returned).
  torch::Tensor report(int64_t slot, const torch::Tensor& output, const torch::Tensor& load,
                       const RouterTotals& totals);
  // [layers, E] float32: each layer's load (zeros for the layers this forward did not run).
  torch::Tensor load() const;
  // The reported layers' totals pooled with the incoming ones, their sums differentiable through
  // `last` (the forward's last output); undefined without the losses or anything to pool.
  RouterTotals totals(const torch::Tensor& last);
  // Pipeline parallelism: the totals of the layers earlier stages ran of this micro-batch, pooled
  // with this stage's (`packed` as pack() writes them), and what this stage sends on: all of them
  // pooled, packed, without gradient (undefined without the losses or anything to pool). The
  // gradient of the sums goes back the other way (set_sums_grad before this stage's backward).
  void set_incoming(const torch::Tensor& packed);
  torch::Tensor outgoing() const;
  // (counts, sums, rows) as one float32 tensor [2E + 2], and back.
  static torch::Tensor pack(const RouterTotals& totals);
  static RouterTotals unpack(const torch::Tensor& packed);
  // The gradient of totals().sums once the backward has passed it; undefined before.
  const torch::Tensor& sums_grad() const { return sums_grad_; }
  void set_sums_grad(torch::Tensor grad) { sums_grad_ = std::move(grad); }

 private:
  bool losses_;
  std::vector<torch::Tensor> load_;  // per slot, undefined until reported
  std::vector<RouterTotals> totals_;
  RouterTotals incoming_;
  torch::Tensor sums_grad_;
  RouterTotals pooled() const;  // incoming and reported, detached
};

// The exchanges of expert parallelism (above) over its group of ranks (lib/train implements them
// over a communicator). Every rank of the group calls them in the same order.
class ExpertParallel {
 public:
  virtual ~ExpertParallel() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Outside autograd: `counts` [P, n] float64 (row j what this rank has for rank j) → [P, n], row
  // i what rank i has for this rank.
  virtual torch::Tensor exchange_counts(const torch::Tensor& counts) = 0;
  // Autograd (comm::all_to_all_v): x's rows by `send` to the ranks in order, the result the rows
  // `receive` from each, in rank order; backward the gradient's rows back the way they came.
  virtual torch::Tensor exchange_rows(const torch::Tensor& x, std::vector<int64_t> receive,
                                      std::vector<int64_t> send) = 0;
};

// The experts' part of a MoE layer under expert parallelism (the header's), for `rows` [M, C]
// sorted by (global) expert with `ends` [E] their ends: the rows sent to the ranks of their
// experts, computed there by `experts` (this rank's E/P) and brought back → [M, C] in `rows`'
// order. Out of memory on the rows it receives (dropless: up to P·M of them) is an out-of-memory
// error that names the MoE layer `slot` and what each rank sent.
torch::Tensor expert_parallel_mlp(ExpertParallel& ep, ExpertsImpl& experts,
                                  const torch::Tensor& rows, const torch::Tensor& ends,
                                  int64_t slot = 0);

class SparseMoeImpl : public torch::nn::Module {
 public:
  // A MoE layer, the `slot`-th of the model's (ModelConfig::moe_layer_slot). With `ep` this rank
  // holds its share of the experts (ExpertParallel); `ep` must outlive the layer.
  SparseMoeImpl(const ModelConfig& config, Materialize materialize, int64_t slot = 0,
                ExpertParallel* ep = nullptr);
  // [..., C] → [..., C]. With `record` (training) it reports to it; `real` [...] bool marks the
  // tokens that are not padding (undefined: all are).
  torch::Tensor forward(const torch::Tensor& x, RouterRecord* record = nullptr,
                        const torch::Tensor& real = {});

  bool norm_topk_prob() const { return norm_topk_prob_; }
  bool float32_weights() const { return float32_weights_; }
  // The group this layer's experts are spread over; null: every expert here.
  ExpertParallel* expert_parallel() const { return ep_; }

  Linear gate{nullptr};  // the router: weight [E, C]
  Experts experts{nullptr};
  Mlp shared_expert{nullptr};          // qwen2_moe only
  Linear shared_expert_gate{nullptr};  // qwen2_moe only: weight [1, C]

 private:
  ExpertParallel* ep_;
  int64_t experts_;  // E, all of them
  int64_t slot_;
  int64_t top_k_;
  bool norm_topk_prob_;
  bool float32_router_;
  bool float32_weights_;
};
TORCH_MODULE(SparseMoe);

// The rows the experts read, one (token, chosen expert) pair each, from `experts` [N, k] (each
// token's top-k expert indices): sorted by expert, within an expert in token order (a stable
// sort), with where each expert's rows end and the token each row belongs to.
struct Routed {
  torch::Tensor order;    // [N·k] int64: each sorted row's index in experts.reshape(-1)
  torch::Tensor tokens;   // [N·k] int64: order / k
  torch::Tensor ends;     // [E] int32: cumulative row counts
  torch::Tensor inverse;  // [N·k] int64: where each (token, slot) went among the sorted rows
};
Routed route(const torch::Tensor& experts, int64_t num_experts);

}  // namespace dstrain::model
