// Kept apart from tokenize_file.cpp so that code which passes its own Tokenizer does not pull in
// tokenizer::load_tokenizer.
#include "data/tokenize_file.h"

namespace dstrain::data {

TokenizeSummary tokenize_to_file(const TokenizeOptions& options) {
  const auto tokenizer = tokenizer::load_tokenizer(options.tokenizer);
  return tokenize_to_file(options, *tokenizer);
}

}  // namespace dstrain::data
