// Ulysses' exchanges are reshapes around one equal-split all-to-all (comm/autograd.h), whose
// row j goes to the group's rank j: to go head-sharded, row j holds head block j of this rank's
// tokens; to go back, row j holds sequence block j of this rank's heads.

#include "train/sequence_parallel.h"

#include "comm/autograd.h"
#include "core/error.h"

namespace dstrain::train {
namespace {

constexpr const char* kSizeKey = "parallel.sequence_parallel_size";

// [B, N, T/P, D] sequence-sharded → [B, N/P, T, D] head-sharded (head block of this rank).
torch::Tensor to_heads(comm::Communicator& group, const torch::Tensor& x) {
  const int64_t P = group.world_size();
  const int64_t B = x.size(0), N = x.size(1), Tl = x.size(2), D = x.size(3);
  const torch::Tensor rows = x.reshape({B, P, N / P, Tl, D}).permute({1, 0, 2, 3, 4});
  const torch::Tensor got = comm::all_to_all(group, rows);  // row i: sequence block i
  return got.permute({1, 2, 0, 3, 4}).reshape({B, N / P, P * Tl, D});
}

// [B, N/P, T, D] head-sharded → [B, N, T/P, D] sequence-sharded (sequence block of this rank).
torch::Tensor to_sequence(comm::Communicator& group, const torch::Tensor& y) {
  const int64_t P = group.world_size();
  const int64_t B = y.size(0), n = y.size(1), T = y.size(2), D = y.size(3);
  const torch::Tensor rows = y.reshape({B, n, P, T / P, D}).permute({2, 0, 1, 3, 4});
  const torch::Tensor got = comm::all_to_all(group, rows);  // row i: head block i
  return got.permute({1, 0, 2, 3, 4}).reshape({B, P * n, T / P, D});
}

// [B, KV, T/P, D] with KV < P (P divisible by KV) → [B, P, T/P, D]: head j is kv head j / (P/KV),
// so rank r of the group gets the kv head its query heads [r·H/P, (r+1)·H/P) use.
torch::Tensor replicate_kv(const torch::Tensor& x, int64_t P) {
  const int64_t B = x.size(0), KV = x.size(1), Tl = x.size(2), D = x.size(3);
  if (KV >= P) return x;
  return x.unsqueeze(2).expand({B, KV, P / KV, Tl, D}).reshape({B, P, Tl, D});
}

}  // namespace

model::AttentionCore ulysses_attention(comm::Communicator& group) {
  return [&group](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  std::optional<int64_t> window, const model::Documents* documents) {
    const int64_t P = group.world_size();
    // After the exchange a rank holds whole rows (for its heads): packed documents apply as they
    // are.
    const torch::Tensor out =
        model::causal_attention(to_heads(group, q), to_heads(group, replicate_kv(k, P)),
                                to_heads(group, replicate_kv(v, P)), window, documents);
    return to_sequence(group, out);
  };
}

SequenceParallel::SequenceParallel(comm::Communicator* group) : group_(group) {}

void SequenceParallel::check_model(const model::ModelConfig& c, int size,
                                   const std::string& model) {
  const int64_t P = size, H = c.num_attention_heads, KV = c.num_key_value_heads;
  if (H % P != 0) {
    fail(ErrorKind::kConfig,
         "model {}: num_attention_heads ({}) is not divisible by {} ({}): each rank of a "
         "sequence-parallel group computes an equal share of the query heads",
         model, H, kSizeKey, P);
  }
  if (KV % P != 0 && P % KV != 0) {
    fail(ErrorKind::kConfig,
         "model {}: num_key_value_heads ({}) and {} ({}) must divide one another: each rank of a "
         "sequence-parallel group takes an equal share of the key/value heads, or one of them "
         "replicated when there are fewer than the group's ranks",
         model, KV, kSizeKey, P);
  }
}

void SequenceParallel::check_length(int64_t max_length, int size) {
  if (max_length % size != 0) {
    fail(ErrorKind::kConfig,
         "data.max_length ({}) is not divisible by {} ({}): each rank of a sequence-parallel "
         "group keeps max_length/{} tokens of every sequence",
         max_length, kSizeKey, size, kSizeKey);
  }
}

void SequenceParallel::apply(model::DecoderModelImpl& model) {
  if (group_) model.set_attention_core(ulysses_attention(*group_));
}

data::Batch SequenceParallel::slice(data::Batch batch) const {
  if (size() == 1) return batch;
  const int64_t local = batch.input_ids.size(1) / size();
  batch.input_ids = batch.input_ids.narrow(1, rank() * local, local).contiguous();
  batch.labels = batch.labels.narrow(1, rank() * local, local).contiguous();
  return batch;
}

model::Positions SequenceParallel::positions(int64_t length) const {
  model::Positions p;
  p.first = rank() * (length / size());
  p.length = length;
  return p;
}

model::LossSum SequenceParallel::reduce_loss(const model::LossSum& local) {
  if (!group_) return local;
  // One collective for all: the sum (differentiable) and the count, in float64 (exact for any
  // realistic count), and a MoE model's router statistics (the sums differentiable), whose losses
  // are products of them: the whole micro-batch's, not the sum of the ranks' (moe.h).
  std::vector<torch::Tensor> parts = {local.sum.to(torch::kFloat64).reshape({1}),
                                      local.count.to(torch::kFloat64).reshape({1})};
  const model::RouterTotals& r = local.router;
  if (r.defined()) {
    for (const torch::Tensor& t : {r.counts, r.sums, r.rows.reshape({1})})
      parts.push_back(t.to(torch::kFloat64));
  }
  const torch::Tensor all = comm::all_reduce_sum(*group_, torch::cat(parts));
  model::LossSum whole{all[0].to(torch::kFloat32), all[1].detach().to(torch::kInt64)};
  if (r.defined()) {
    const int64_t E = r.counts.size(0);
    whole.router = {all.narrow(0, 2, E).detach().to(torch::kFloat32),
                    all.narrow(0, 2 + E, E + 1).to(torch::kFloat32),
                    all[3 + 2 * E].detach().to(torch::kFloat32)};
  }
  return whole;
}

}  // namespace dstrain::train
