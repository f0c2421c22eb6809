#include "data/corpus.h"

namespace dstrain::data {

void Corpus::add_document(const int32_t* data, int64_t length, int64_t prompt_length) {
  if (prompt_length > 0 || !prompt_lengths.empty()) {
    prompt_lengths.resize(static_cast<size_t>(num_documents()), 0);
    prompt_lengths.push_back(prompt_length);
  }
  tokens.insert(tokens.end(), data, data + length);
  offsets.push_back(static_cast<int64_t>(tokens.size()));
}

void Corpus::append(const Corpus& other) {
  if (!other.prompt_lengths.empty() || !prompt_lengths.empty()) {
    prompt_lengths.resize(static_cast<size_t>(num_documents()), 0);
    for (int64_t d = 0; d < other.num_documents(); ++d) {
      prompt_lengths.push_back(other.prompt_length(d));
    }
  }
  const int64_t base = num_tokens();
  tokens.insert(tokens.end(), other.tokens.begin(), other.tokens.end());
  offsets.reserve(offsets.size() + other.offsets.size() - 1);
  for (size_t i = 1; i < other.offsets.size(); ++i) offsets.push_back(base + other.offsets[i]);
}

}  // namespace dstrain::data
