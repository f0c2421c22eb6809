#include "tokenizer/bpe_model.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace dstrain::tokenizer {

BpeModel::BpeModel(const BpeSpec& spec) : ignore_merges_(spec.ignore_merges) {
  build_ids(spec);  // first: a vocabulary without byte symbols is the clearer error
  merges_ = MergeTable(spec);
  if (ignore_merges_) vocab_ = spec.vocab;
}

void BpeModel::build_ids(const BpeSpec& spec) {
  int32_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) {
    if (id < 0)
      fail(ErrorKind::kInput, "{}: token '{}' has negative id {}", spec.vocab_origin, token, id);
    max_id = std::max(max_id, id);
  }
  id_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  has_id_.assign(id_bytes_.size(), false);
  for (const auto& [token, id] : spec.vocab) {
    // Byte-level tokens decode through the byte map; anything else (e.g. "<|endoftext|>" kept in
    // the vocabulary itself) stands for its own UTF-8 text.
    std::optional<std::string> bytes = symbols_to_bytes(token);
    id_bytes_[id] = bytes ? std::move(*bytes) : token;
    has_id_[id] = true;
  }
  for (int b = 0; b < 256; ++b) {
    auto it = spec.vocab.find(byte_symbols()[b]);
    if (it == spec.vocab.end()) {
      fail(ErrorKind::kInput,
           "{}: the vocabulary has no token for byte 0x{:02X} ('{}'); expected "
           "a byte-level BPE vocabulary with all 256 byte symbols",
           spec.vocab_origin, b, byte_symbols()[b]);
    }
    byte_ids_[b] = it->second;
  }
}

void BpeModel::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    auto it = vocab_.find(bytes_to_symbols(piece));
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  if (cache_.lookup(piece, out)) return;
  const size_t before = out.size();
  merge(piece, out);
  cache_.insert(piece, out.data() + before, out.size() - before);
}

void BpeModel::merge(std::string_view piece, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  for (unsigned char b : piece) symbols.push_back(byte_ids_[b]);
  merges_.apply(symbols, out);
}

const std::string* BpeModel::token_bytes(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_bytes_.size()) || !has_id_[id]) return nullptr;
  return &id_bytes_[id];
}

}  // namespace dstrain::tokenizer
