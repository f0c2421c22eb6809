#pragma once
// Parallel tokenization of texts into one Corpus. Tokenizer::encode is const and thread-safe, so
// the texts are cut into consecutive pieces of about 256 kB, worker threads take the next piece
// until none is left (long and short texts balance out), and the pieces' results are concatenated
// in order: the result does not depend on the number of threads.

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "data/corpus.h"
#include "data/progress.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::data {

// Number of threads for `requested` (0 = every core the machine has), never below 1.
int tokenize_threads(int requested);

// Where text i came from, put in front of an error's message ("data/d.parquet: row 17").
using TextOrigin = std::function<std::string(size_t)>;

struct TokenizeSettings {
  int threads = 0;          // as tokenize_threads()
  bool check_utf8 = false;  // check each text first (for sources not checked as a whole file)
  Progress* progress = nullptr;
  int64_t progress_bytes = 0;  // input bytes these texts stand for, credited as pieces finish
};

// Encodes each text, keeping their order. Error(kInput) "<origin(i)>: invalid UTF-8 at byte
// offset N of the text" (with check_utf8); an error from the tokenizer is rethrown with its kind
// and "<origin(i)>: " in front. With several bad texts the first one is reported.
Corpus tokenize_texts(const std::vector<std::string_view>& texts,
                      const tokenizer::Tokenizer& tokenizer, const TokenizeSettings& settings,
                      const TextOrigin& origin);

// The same for whole documents; errors name "<origin>: document <i>".
Corpus tokenize_documents(const std::vector<std::string>& documents,
                          const tokenizer::Tokenizer& tokenizer, int threads,
                          const std::string& origin);

}  // namespace dstrain::data
