#include "data/batch.h"

#include <algorithm>

namespace dstrain::data {

Batch collate(const SampleSet& samples, const std::vector<int64_t>& indices, bool pin_memory) {
  const int64_t b = static_cast<int64_t>(indices.size());
  const int64_t t = samples.max_length();
  auto options = torch::TensorOptions().dtype(torch::kInt64);
  if (pin_memory && torch::cuda::is_available()) options = options.pinned_memory(true);
  Batch batch;
  batch.input_ids = torch::empty({b, t}, options);
  batch.labels = torch::empty({b, t}, options);
  int64_t* ids = batch.input_ids.data_ptr<int64_t>();
  int64_t* labels = batch.labels.data_ptr<int64_t>();
  if (samples.packs_documents()) batch.documents.resize(static_cast<size_t>(b));
  batch.row_tokens.assign(static_cast<size_t>(b), 0);
  for (int64_t row = 0; row < b; ++row) {
    std::vector<int64_t>* lengths =
        batch.documents.empty() ? nullptr : &batch.documents[static_cast<size_t>(row)];
    if (indices[row] < 0) {
      std::fill_n(ids + row * t, t, samples.pad_id());
      std::fill_n(labels + row * t, t, kIgnoreIndex);
      if (lengths) *lengths = {t};
      continue;
    }
    const int64_t tokens = samples.fill(indices[row], ids + row * t, labels + row * t, lengths);
    batch.row_tokens[static_cast<size_t>(row)] = tokens;
    batch.tokens += tokens;
    ++batch.num_rows;
  }
  batch.labelled =
      std::count_if(labels, labels + b * t, [](int64_t l) { return l != kIgnoreIndex; });
  return batch;
}

}  // namespace dstrain::data
