#pragma once
// Parallel tokenization of documents into one Corpus. Tokenizer::encode is const and thread-safe,
// so documents are split into contiguous ranges, one per thread, and the per-thread results are
// concatenated in order: the result does not depend on the number of threads.

#include <string>
#include <vector>

#include "data/corpus.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::data {

// Number of threads for `requested` (0 = hardware concurrency, at most 16), never below 1.
int tokenize_threads(int requested);

// Encodes each document; document order is preserved. An error from the tokenizer is rethrown with
// the same kind and "<origin>: document <i>: " in front of its message.
Corpus tokenize_documents(const std::vector<std::string>& documents,
                          const tokenizer::Tokenizer& tokenizer, int threads,
                          const std::string& origin);

}  // namespace dstrain::data
