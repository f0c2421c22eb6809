#include "data/tokenize_file.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fs.h"
#include "data/source.h"
#include "data/token_file.h"
#include "tokenizer/document_prefix.h"

namespace dstrain::data {

TokenizeSummary tokenize_to_file(const TokenizeOptions& o, const tokenizer::Tokenizer& base) {
  if (o.output.empty()) fail(ErrorKind::kUsage, "no output file given (--output)");
  const tokenizer::PrefixedTokenizer tokenizer(
      base, tokenizer::document_prefix(base, o.add_bos, "--add-bos"));
  SourceStats stats;
  const Corpus corpus = load_corpus(o.input, source_options(o), tokenizer, &stats);
  if (corpus.num_tokens() == 0) {
    fail(ErrorKind::kInput,
         "{}: the dataset is empty: {} documents, no tokens ({} NULL rows); nothing written",
         o.input, corpus.num_documents(), stats.null_rows);
  }
  write_token_file(o.output, corpus, tokenizer.vocab_size());
  return {corpus.num_documents(), corpus.num_tokens(), tokenizer.vocab_size() <= 65536 ? 2 : 4,
          stats.null_rows};
}

int64_t decode_to_jsonl(const DecodeOptions& o) {
  const std::unique_ptr<tokenizer::Tokenizer> tok = tokenizer::load_tokenizer(o.tokenizer);
  const Corpus corpus = read_token_file(o.input);
  std::string out;
  for (int64_t d = 0; d < corpus.num_documents(); ++d) {
    const int32_t* ids = corpus.document_data(d);
    const std::string text =
        tok->decode(std::vector<int32_t>(ids, ids + corpus.document_length(d)));
    out += nlohmann::json{{"text", text}}.dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace);
    out += '\n';
  }
  fs::write_file_atomic(o.output, out);
  return corpus.num_documents();
}

}  // namespace dstrain::data
