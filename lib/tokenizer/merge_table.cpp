#include "tokenizer/merge_table.h"

#include <algorithm>

#include "core/error.h"

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

MergeTable::MergeTable(const BpeSpec& spec) {
  merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    const int32_t a = merge_token_id(spec, rank, left);
    const int32_t b = merge_token_id(spec, rank, right);
    const int32_t merged = merge_token_id(spec, rank, left + right);
    merges_.emplace(pair_key(a, b), Merge{static_cast<int32_t>(rank), merged});
  }
}

// Repeatedly merges the adjacent pair of lowest rank (leftmost on ties). Symbols form a linked list
// over their positions; candidate pairs sit in a min-heap and are dropped when stale. Since a
// merge's result only takes part in merges learned later, the order equals the classic
// "merge every occurrence of the best pair, repeat" loop, in O(n log n) instead of O(n^2).
void MergeTable::apply(const std::vector<int32_t>& symbols, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id, prev, next;
  };
  struct Candidate {
    int32_t rank, pos, left, right, merged;
  };
  if (symbols.empty()) return;
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<Candidate> heap;
  syms.clear();
  heap.clear();
  const auto n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i < n; ++i) syms.push_back({symbols[i], i - 1, i + 1 < n ? i + 1 : -1});
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

}  // namespace dstrain::tokenizer
