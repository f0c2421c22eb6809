#pragma once
// Entry point for the trainer: reads the train (and eval) sources, tokenizes them and forms
// samples. Every rank calls this and gets the same result (tokenization is deterministic). With a
// cache_dir, tokens are cached there (token_cache.h): the first process tokenizes, the others and
// later runs read its result. `dstrain data tokenize` (tokenize_file.h) pre-tokenizes by hand.
//
// Eval set: eval_path when given (eval_split is then ignored). Otherwise, with eval_split > 0, a
// seeded random ceil(eval_split × documents) documents (at least 1, and at least one document left
// for training) go to eval and the rest to train; both keep corpus order. The split depends only on
// (seed, document count), so every rank and every resume carves the same one.

#include <cstdint>
#include <memory>
#include <string>

#include "data/samples.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::data {

// The trainer maps config::DataSection (+ training.seed) onto this.
struct DataOptions {
  std::string train_path;
  std::string eval_path;        // "" = none (or eval_split)
  std::string format = "auto";  // auto | text | jsonl | tokens | parquet | prompt_completion
  std::string text_field = "text";
  std::string prompt_field = "prompt";  // prompt_completion (source.h)
  std::string completion_field = "completion";
  std::string document = "file";  // text: file | line
  int64_t max_length = 1024;
  Packing packing = Packing::kDocuments;
  LongDocuments long_documents = LongDocuments::kSplit;
  std::string add_bos = "auto";  // auto | true | false (tokenizer/document_prefix.h)
  double eval_split = 0.0;       // in [0, 1)
  uint64_t seed = 42;
  int threads = 0;               // tokenizer threads; 0 = every core
  std::string cache_dir;         // token cache (token_cache.h); "" = none
  std::string staged_cache_dir;  // a node-local copy of cache entries, read first; "" = none
};

struct Datasets {
  std::shared_ptr<const SampleSet> train;
  std::shared_ptr<const SampleSet> eval;  // null when there is no eval set
};

// Error(kInput) for missing files, unreadable/bad content (see source.h) and a dataset without any
// token; Error(kConfig) for bad option values. Batch-size checks happen in Loader.
Datasets build_datasets(const DataOptions& options, const tokenizer::Tokenizer& tokenizer);

}  // namespace dstrain::data
