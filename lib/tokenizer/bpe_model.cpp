#include "tokenizer/bpe_model.h"

#include <algorithm>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace dstrain::tokenizer {
namespace {

// Id of a merge's part or result; the error names the merge (file and line) at fault.
int32_t merge_token_id(const BpeSpec& spec, size_t rank, const std::string& token) {
  auto it = spec.vocab.find(token);
  if (it == spec.vocab.end()) {
    fail(ErrorKind::kInput, "{}: token '{}' is not in the vocabulary ({})", spec.merge_origin(rank),
         token, spec.vocab_origin);
  }
  return it->second;
}

}  // namespace

BpeModel::BpeModel(const BpeSpec& spec) : ignore_merges_(spec.ignore_merges) {
  build_ids(spec);
  build_merges(spec);
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

void BpeModel::build_merges(const BpeSpec& spec) {
  merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    const int32_t a = merge_token_id(spec, rank, left);
    const int32_t b = merge_token_id(spec, rank, right);
    const int32_t merged = merge_token_id(spec, rank, left + right);
    // A repeated pair keeps its first (highest-priority) rank.
    merges_.emplace(pair_key(a, b), Merge{static_cast<int32_t>(rank), merged});
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

// Repeatedly merges the adjacent pair of lowest rank (leftmost on ties). Symbols form a linked list
// over their byte positions; candidate pairs sit in a min-heap and are dropped when stale. Since a
// merge's result only takes part in merges learned later, the order equals the classic
// "merge every occurrence of the best pair, repeat" loop, in O(n log n) instead of O(n^2).
void BpeModel::merge(std::string_view piece, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id, prev, next;
  };
  struct Candidate {
    int32_t rank, pos, left, right, merged;
  };
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<Candidate> heap;
  syms.clear();
  heap.clear();
  const auto n = static_cast<int32_t>(piece.size());
  for (int32_t i = 0; i < n; ++i) {
    syms.push_back(
        {byte_ids_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1});
  }
  auto later = [](const Candidate& x, const Candidate& y) {
    return x.rank != y.rank ? x.rank > y.rank : x.pos > y.pos;
  };
  auto push = [&](int32_t pos) {
    const int32_t next = syms[pos].next;
    if (next < 0) return;
    auto it = merges_.find(pair_key(syms[pos].id, syms[next].id));
    if (it == merges_.end()) return;
    heap.push_back({it->second.rank, pos, syms[pos].id, syms[next].id, it->second.merged_id});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& s = syms[c.pos];
    if (s.id != c.left || s.next < 0 || syms[s.next].id != c.right) continue;  // stale
    Symbol& right = syms[s.next];
    right.id = -1;
    s.id = c.merged;
    s.next = right.next;
    if (s.next >= 0) syms[s.next].prev = c.pos;
    if (s.prev >= 0) push(s.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

const std::string* BpeModel::token_bytes(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(id_bytes_.size()) || !has_id_[id]) return nullptr;
  return &id_bytes_[id];
}

}  // namespace dstrain::tokenizer
