#include "data/tokenize.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "core/error.h"
#include "core/utf8.h"

namespace dstrain::data {
namespace {

constexpr size_t kPieceBytes = size_t{256} << 10;

struct Piece {
  size_t begin = 0, end = 0;           // texts [begin, end)
  size_t bytes_before = 0, bytes = 0;  // text bytes before the piece and in it
};

std::vector<Piece> cut_pieces(const std::vector<std::string_view>& texts) {
  std::vector<Piece> pieces;
  Piece p;
  for (size_t i = 0; i < texts.size(); ++i) {
    p.bytes += texts[i].size();
    if (p.bytes >= kPieceBytes || i + 1 == texts.size()) {
      p.end = i + 1;
      pieces.push_back(p);
      p = Piece{i + 1, i + 1, p.bytes_before + p.bytes, 0};
    }
  }
  return pieces;
}

Corpus encode_piece(const std::vector<std::string_view>& texts, const Piece& piece,
                    const tokenizer::Tokenizer& tok, bool check_utf8, const TextOrigin& origin) {
  Corpus out;
  for (size_t i = piece.begin; i < piece.end; ++i) {
    if (check_utf8) {
      if (auto bad = find_invalid_utf8(texts[i])) {
        fail(ErrorKind::kInput, "{}: invalid UTF-8 at byte offset {} of the text", origin(i), *bad);
      }
    }
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(texts[i]);
    } catch (const Error& e) {
      throw Error(e.kind(), fmt::format("{}: {}", origin(i), e.what()));
    }
    out.add_document(ids.data(), static_cast<int64_t>(ids.size()));
  }
  return out;
}

// Input bytes to credit for a piece: the pieces' shares of `total_credit` telescope to it exactly.
int64_t piece_credit(const Piece& p, size_t all_bytes, int64_t total_credit) {
  if (all_bytes == 0) return 0;
  const auto upto = [&](size_t bytes) {
    return static_cast<int64_t>(static_cast<double>(total_credit) * static_cast<double>(bytes) /
                                static_cast<double>(all_bytes));
  };
  return upto(p.bytes_before + p.bytes) - upto(p.bytes_before);
}

}  // namespace

int tokenize_threads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

Corpus tokenize_texts(const std::vector<std::string_view>& texts,
                      const tokenizer::Tokenizer& tokenizer, const TokenizeSettings& settings,
                      const TextOrigin& origin) {
  const std::vector<Piece> pieces = cut_pieces(texts);
  const size_t all_bytes = pieces.empty() ? 0 : pieces.back().bytes_before + pieces.back().bytes;
  std::vector<Corpus> results(pieces.size());
  std::vector<std::exception_ptr> errors(pieces.size());
  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t k = next++; k < pieces.size(); k = next++) {
      try {
        results[k] = encode_piece(texts, pieces[k], tokenizer, settings.check_utf8, origin);
      } catch (...) {
        errors[k] = std::current_exception();
      }
      if (settings.progress) {
        settings.progress->advance(piece_credit(pieces[k], all_bytes, settings.progress_bytes));
      }
    }
  };
  const size_t n_threads =
      std::min<size_t>(static_cast<size_t>(tokenize_threads(settings.threads)), pieces.size());
  std::vector<std::thread> workers;
  for (size_t t = 1; t < n_threads; ++t) workers.emplace_back(work);
  work();
  for (auto& w : workers) w.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  Corpus out;
  size_t tokens = 0;
  for (const Corpus& r : results) tokens += r.tokens.size();
  out.tokens.reserve(tokens);
  out.offsets.reserve(texts.size() + 1);
  for (const Corpus& r : results) out.append(r);
  return out;
}

Corpus tokenize_documents(const std::vector<std::string>& documents,
                          const tokenizer::Tokenizer& tokenizer, int threads,
                          const std::string& origin) {
  const std::vector<std::string_view> texts(documents.begin(), documents.end());
  TokenizeSettings settings;
  settings.threads = threads;
  return tokenize_texts(texts, tokenizer, settings,
                        [&](size_t i) { return fmt::format("{}: document {}", origin, i); });
}

}  // namespace dstrain::data
