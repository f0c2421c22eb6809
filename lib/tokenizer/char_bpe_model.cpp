#include "tokenizer/char_bpe_model.h"

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "core/utf8.h"

namespace dstrain::tokenizer {

CharBpeModel::CharBpeModel(const BpeSpec& spec)
    : vocab_(spec.vocab),
      byte_fallback_(spec.byte_fallback),
      fuse_unk_(spec.fuse_unk),
      unk_token_(spec.unk_token),
      ignore_merges_(spec.ignore_merges) {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) {
    if (id < 0)
      fail(ErrorKind::kInput, "{}: token '{}' has negative id {}", spec.vocab_origin, token, id);
    max_id = std::max(max_id, id);
  }
  id_text_.assign(static_cast<size_t>(max_id + 1), std::string());
  has_id_.assign(id_text_.size(), false);
  for (const auto& [token, id] : vocab_) {
    id_text_[id] = token;
    has_id_[id] = true;
    size_t pos = 0;
    if (!token.empty() && !find_invalid_utf8(token)) {
      const char32_t cp = next_code_point(token, pos);
      if (pos == token.size()) char_ids_.emplace(cp, id);
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
  }
  merges_ = MergeTable(spec);
}

int32_t CharBpeModel::unk_id() const {
  auto it = vocab_.find(*unk_token_);
  if (it == vocab_.end()) {
    fail(ErrorKind::kInput,
         "the text has a character that is not in the vocabulary and the unk token '{}' is not in "
         "the vocabulary either",
         *unk_token_);
  }
  return it->second;
}

void CharBpeModel::first_symbols(std::string_view piece, std::vector<int32_t>& symbols) const {
  std::optional<int32_t> pending_unk;
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t start = pos;
    const char32_t cp = next_code_point(piece, pos);
    if (auto it = char_ids_.find(cp); it != char_ids_.end()) {
      if (pending_unk) symbols.push_back(*pending_unk);
      pending_unk.reset();
      symbols.push_back(it->second);
      continue;
    }
    const std::string_view bytes = piece.substr(start, pos - start);
    if (byte_fallback_ && std::all_of(bytes.begin(), bytes.end(), [&](char b) {
          return byte_ids_[static_cast<unsigned char>(b)] >= 0;
        })) {
      for (char b : bytes) symbols.push_back(byte_ids_[static_cast<unsigned char>(b)]);
      continue;
    }
    if (!unk_token_) continue;
    if (pending_unk && !fuse_unk_) symbols.push_back(*pending_unk);
    if (!pending_unk || !fuse_unk_) pending_unk = unk_id();
  }
  if (pending_unk) symbols.push_back(*pending_unk);
}

void CharBpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (auto it = vocab_.find(std::string(piece)); it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (cache_.lookup(piece, out)) return;
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  first_symbols(piece, symbols);
  const size_t before = out.size();
  merges_.apply(symbols, out);
  cache_.insert(piece, out.data() + before, out.size() - before);
}

const std::string* CharBpeModel::token_text(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_text_.size()) || !has_id_[id]) return nullptr;
  return &id_text_[id];
}

}  // namespace dstrain::tokenizer
