#include "data/tokenize.h"

#include <algorithm>
#include <exception>
#include <thread>

#include "core/error.h"

namespace dstrain::data {
namespace {

Corpus encode_range(const std::vector<std::string>& docs, size_t begin, size_t end,
                    const tokenizer::Tokenizer& tok, const std::string& origin) {
  Corpus out;
  for (size_t i = begin; i < end; ++i) {
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(docs[i]);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("{}: document {}: {}", origin, i, e.what()));
    }
    out.add_document(ids.data(), static_cast<int64_t>(ids.size()));
  }
  return out;
}

}  // namespace

int tokenize_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hw, 1u, 16u));
}

Corpus tokenize_documents(const std::vector<std::string>& documents,
                          const tokenizer::Tokenizer& tokenizer, int threads,
                          const std::string& origin) {
  const size_t n = documents.size();
  const size_t parts = std::max<size_t>(1, std::min<size_t>(tokenize_threads(threads), n));
  if (parts == 1) return encode_range(documents, 0, n, tokenizer, origin);
  std::vector<Corpus> results(parts);
  std::vector<std::exception_ptr> errors(parts);
  std::vector<std::thread> workers;
  for (size_t p = 0; p < parts; ++p) {
    workers.emplace_back([&, p] {
      try {
        results[p] = encode_range(documents, n * p / parts, n * (p + 1) / parts, tokenizer, origin);
      } catch (...) {
        errors[p] = std::current_exception();
      }
    });
  }
  for (auto& w : workers) w.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  Corpus out = std::move(results[0]);
  for (size_t p = 1; p < parts; ++p) out.append(results[p]);
  return out;
}

}  // namespace dstrain::data
