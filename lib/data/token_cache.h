#pragma once
// Tokenized datasets cached next to the run, so that a second run, a resumed run and every other
// rank on the machine read tokens instead of tokenizing again.
//
// An entry is keyed by what decides its tokens: the content of every data file (XXH3-128 of the
// bytes, in file order, with each file's resolved format), the format options (format,
// text_field, document), data.max_length, and a fingerprint of the tokenizer's behaviour (its
// vocabulary size and special ids, the text of every id, that text encoded again, and the ids of
// a few probe texts), so that new tokenizer files or a changed tokenizer implementation miss the
// cache. Renaming or moving files keeps their entry; changing one byte does not.
//
// Files in `dir` for key K (32 hex digits):
//   K.tokens  the corpus as a token file (token_file.h), written atomically
//   K.json    {"key_text", "source", "documents", "tokens", "null_rows"}, written after it
//   K.lock    flock(2)ed while the entry is looked up or made; a process that finds it held waits,
//             so of several ranks starting at once one tokenizes and the others read its result.
//             The kernel drops the lock of a process that dies, and a half-made entry was never
//             renamed into place, so a crash leaves no stale state.
// An entry that does not read back (damaged, or from another key with the same name) is made
// again. Nothing removes old entries: delete the directory to reclaim the space.
//
// A staged copy (`dstrain launch --stage-dir`, launcher/stage_inputs.h): a node-local folder of
// entries copied from `dir`. An entry found there complete is read from it, without a lock (it is
// never written); otherwise `dir` is used as above, so a new entry still lands in the shared cache.

#include <cstdint>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "data/source.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::data {

struct CacheOptions {
  std::string dir;         // where entries live, created when missing
  int64_t max_length = 0;  // data.max_length, part of the key
  std::string staged_dir;  // a read-only node-local copy of entries of `dir`; "" = none
};

// The text the key is the hash of: one line per ingredient (see above). `files` are the files of
// the source (list_source_files) in order.
std::string cache_key_text(const std::vector<std::string>& files, const SourceOptions& options,
                           int64_t max_length, const tokenizer::Tokenizer& tokenizer);

// The fingerprint of the tokenizer's behaviour (32 hex digits); independent of `threads`.
std::string tokenizer_fingerprint(const tokenizer::Tokenizer& tokenizer, int threads);

// load_corpus(path, options, tokenizer, stats) through the cache in cache.dir. Sources made only
// of token files are read directly (there is nothing to save). Errors as load_corpus; a cache
// directory that cannot be written is warned about and the corpus is returned without caching.
Corpus load_corpus_cached(const std::string& path, const SourceOptions& options,
                          const CacheOptions& cache, const tokenizer::Tokenizer& tokenizer,
                          SourceStats* stats = nullptr);

}  // namespace dstrain::data
