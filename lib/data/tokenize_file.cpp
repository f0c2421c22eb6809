#include "data/tokenize_file.h"

#include "core/error.h"
#include "data/source.h"
#include "data/token_file.h"

namespace dstrain::data {

TokenizeSummary tokenize_to_file(const TokenizeOptions& o, const tokenizer::Tokenizer& tokenizer) {
  if (o.output.empty()) fail(ErrorKind::kUsage, "no output file given (--output)");
  SourceStats stats;
  const Corpus corpus = load_corpus(
      o.input, SourceOptions{o.format, o.text_field, o.document, o.threads}, tokenizer, &stats);
  if (corpus.num_tokens() == 0) {
    fail(ErrorKind::kInput,
         "{}: the dataset is empty: {} documents, no tokens ({} NULL rows); nothing written",
         o.input, corpus.num_documents(), stats.null_rows);
  }
  write_token_file(o.output, corpus, tokenizer.vocab_size());
  return {corpus.num_documents(), corpus.num_tokens(), tokenizer.vocab_size() <= 65536 ? 2 : 4,
          stats.null_rows};
}

}  // namespace dstrain::data
