#include "data/datasets.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "data/sampler.h"
#include "data/source.h"
#include "data/token_cache.h"
#include "tokenizer/document_prefix.h"

namespace dstrain::data {
namespace {

// Stream id mixed into the seed so the split is independent of the epoch shuffles.
constexpr uint64_t kSplitStream = 0x65766C5F73706C74ull;

std::string nulls_note(const SourceStats& stats) {
  return stats.null_rows ? fmt::format(" ({} NULL rows skipped)", stats.null_rows) : "";
}

std::shared_ptr<const Corpus> load(const std::string& path, const DataOptions& o,
                                   const tokenizer::Tokenizer& tok, SourceStats& stats) {
  const SourceOptions so = source_options(o);
  auto corpus = std::make_shared<Corpus>(load_corpus_cached(
      path, so, CacheOptions{o.cache_dir, o.max_length, o.staged_cache_dir}, tok, &stats));
  if (corpus->num_tokens() == 0) {
    fail(ErrorKind::kInput, "{}: the dataset is empty: {} documents, no tokens{}", path,
         corpus->num_documents(), nulls_note(stats));
  }
  return corpus;
}

SampleOptions sample_options(const DataOptions& o, const tokenizer::Tokenizer& tok, bool eval) {
  SampleOptions s;
  s.max_length = o.max_length;
  s.packing = o.packing;
  s.long_documents = o.long_documents;
  s.keep_partial_window = eval;
  s.eos_id = tok.eos_id();
  s.pad_id = tok.pad_id().value_or(tok.eos_id().value_or(0));
  return s;
}

std::vector<int64_t> all_documents(const Corpus& c) {
  std::vector<int64_t> docs(static_cast<size_t>(c.num_documents()));
  std::iota(docs.begin(), docs.end(), 0);
  return docs;
}

// Splits document ids into (train, eval) as described in datasets.h.
std::pair<std::vector<int64_t>, std::vector<int64_t>> split_documents(int64_t n, double fraction,
                                                                      uint64_t seed,
                                                                      const std::string& path) {
  if (n < 2) {
    fail(ErrorKind::kInput, "{}: data.eval_split needs at least 2 documents, the dataset has {}",
         path, n);
  }
  const auto k = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(fraction * n)), 1, n - 1);
  std::vector<int64_t> perm = epoch_permutation(n, seed ^ kSplitStream, 0, true);
  std::vector<int64_t> eval(perm.begin(), perm.begin() + k), train(perm.begin() + k, perm.end());
  std::sort(eval.begin(), eval.end());
  std::sort(train.begin(), train.end());
  return {std::move(train), std::move(eval)};
}

}  // namespace

Datasets build_datasets(const DataOptions& o, const tokenizer::Tokenizer& base) {
  if (!(o.eval_split >= 0.0 && o.eval_split < 1.0)) {
    fail(ErrorKind::kConfig, "data.eval_split: expected a fraction in [0, 1), got {}",
         o.eval_split);
  }
  // Text sources are tokenized through `tok`, so the bos is in every document (and in the token
  // cache's key, through the tokenizer's fingerprint); token files are read as they are.
  const tokenizer::PrefixedTokenizer tok(base, tokenizer::document_prefix(base, o.add_bos));
  if (!tok.prefix().empty()) {
    std::string ids;
    for (int32_t id : tok.prefix()) ids += fmt::format(" {}", id);
    log::info("data: each document starts with token{}{} (data.add_bos: {})",
              tok.prefix().size() > 1 ? "s" : "", ids, o.add_bos);
  }
  if (o.packing != Packing::kPad && !tok.eos_id()) {
    log::warn("data: the tokenizer has no eos token; packed documents are joined without one");
  }
  SourceStats train_stats, eval_stats;
  auto train_corpus = load(o.train_path, o, tok, train_stats);
  Datasets out;
  std::vector<int64_t> train_docs = all_documents(*train_corpus);
  std::string eval_note;
  if (!o.eval_path.empty()) {
    auto eval_corpus = load(o.eval_path, o, tok, eval_stats);
    out.eval = std::make_shared<SampleSet>(eval_corpus, all_documents(*eval_corpus),
                                           sample_options(o, tok, true), o.eval_path);
    eval_note = fmt::format(" from {}: {} documents, {} tokens{}", o.eval_path,
                            eval_corpus->num_documents(), eval_corpus->num_tokens(),
                            nulls_note(eval_stats));
  } else if (o.eval_split > 0.0) {
    auto [train, eval] =
        split_documents(train_corpus->num_documents(), o.eval_split, o.seed, o.train_path);
    train_docs = std::move(train);
    out.eval =
        std::make_shared<SampleSet>(train_corpus, std::move(eval), sample_options(o, tok, true),
                                    o.train_path + " (eval split)");
  }
  out.train = std::make_shared<SampleSet>(train_corpus, std::move(train_docs),
                                          sample_options(o, tok, false), o.train_path);
  log::info("data: {}: {} documents, {} tokens{} -> {} train samples of {} tokens{}", o.train_path,
            train_corpus->num_documents(), train_corpus->num_tokens(), nulls_note(train_stats),
            out.train->size(), o.max_length,
            out.eval ? fmt::format(", {} eval samples{}", out.eval->size(), eval_note) : "");
  if (!train_corpus->prompt_lengths.empty()) {
    int64_t prompt_tokens = 0;
    for (int64_t n : train_corpus->prompt_lengths) prompt_tokens += n;
    log::info("data: prompt/completion pairs: {} of {} tokens ({:.1f}%) are prompts, not labelled",
              prompt_tokens, train_corpus->num_tokens(),
              100.0 * static_cast<double>(prompt_tokens) /
                  static_cast<double>(train_corpus->num_tokens()));
  }
  log::info(
      "data: {} packing: {:.1f}% of the train samples' positions are padding{}",
      packing_word(o.packing), 100.0 * out.train->padding_fraction(),
      out.eval ? fmt::format(", {:.1f}% of eval's", 100.0 * out.eval->padding_fraction()) : "");
  return out;
}

}  // namespace dstrain::data
