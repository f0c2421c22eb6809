#pragma once
// A tokenized corpus: every token of every document in one contiguous buffer plus document offsets,
// so a dataset of millions of documents costs two allocations, not one vector per document.
// Documents carry no eos; samples.h inserts it when forming samples. A prompt/completion document
// (data.format: prompt_completion) also has a prompt length: its first tokens, which no label
// targets (samples.h).

#include <cstdint>
#include <string>
#include <vector>

namespace dstrain::data {

struct Corpus {
  std::vector<int32_t> tokens;  // [total tokens], all documents back to back
  std::vector<int64_t> offsets{
      0};  // [documents + 1]; document i is tokens[offsets[i], offsets[i+1])

  // [documents]: the prompt tokens at the start of each document; empty when no document has any.
  std::vector<int64_t> prompt_lengths;

  int64_t num_documents() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t prompt_length(int64_t doc) const {
    return prompt_lengths.empty() ? 0 : prompt_lengths[static_cast<size_t>(doc)];
  }
  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t document_length(int64_t doc) const { return offsets[doc + 1] - offsets[doc]; }
  const int32_t* document_data(int64_t doc) const { return tokens.data() + offsets[doc]; }

  // Appends one document (copied), its first `prompt_length` tokens a prompt.
  void add_document(const int32_t* data, int64_t length, int64_t prompt_length = 0);
  // Appends every document of `other`, keeping their order.
  void append(const Corpus& other);
};

}  // namespace dstrain::data
