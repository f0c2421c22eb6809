#include "data/document_bins.h"

#include <algorithm>

#include "core/error.h"

namespace dstrain::data {
namespace {

// The pieces of one document's sequence (n tokens): T positions each (consecutive pieces sharing
// one token), or the first T.
void add_pieces(int64_t document, int64_t n, int64_t capacity, LongDocuments long_docs,
                std::vector<DocumentPiece>& out) {
  const int64_t positions = n - 1;
  if (positions < 1) return;
  if (long_docs == LongDocuments::kTruncate) {
    out.push_back({document, 0, std::min(positions, capacity)});
    return;
  }
  for (int64_t begin = 0; begin < positions; begin += capacity) {
    out.push_back({document, begin, std::min(capacity, positions - begin)});
  }
}

// First-fit decreasing of one window's pieces into new bins, appended to `bins`.
void pack_window(std::vector<DocumentPiece> pieces, int64_t capacity,
                 std::vector<DocumentBin>& bins) {
  std::stable_sort(
      pieces.begin(), pieces.end(),
      [](const DocumentPiece& a, const DocumentPiece& b) { return a.length > b.length; });
  const size_t first = bins.size();
  std::vector<int64_t> room;
  for (const DocumentPiece& p : pieces) {
    size_t at = 0;
    while (at < room.size() && room[at] < p.length) ++at;
    if (at == room.size()) {
      room.push_back(capacity);
      bins.emplace_back();
    }
    room[at] -= p.length;
    bins[first + at].push_back(p);
  }
}

}  // namespace

std::vector<DocumentBin> pack_documents(const std::vector<int64_t>& sequence_lengths,
                                        int64_t capacity, int64_t window, LongDocuments long_docs) {
  if (capacity < 1 || window < 1) {
    fail(ErrorKind::kInternal, "pack_documents: capacity {} and window {} must be >= 1", capacity,
         window);
  }
  std::vector<DocumentBin> bins;
  const auto n = static_cast<int64_t>(sequence_lengths.size());
  for (int64_t start = 0; start < n; start += window) {
    std::vector<DocumentPiece> pieces;
    for (int64_t d = start; d < std::min(n, start + window); ++d) {
      add_pieces(d, sequence_lengths[static_cast<size_t>(d)], capacity, long_docs, pieces);
    }
    pack_window(std::move(pieces), capacity, bins);
  }
  return bins;
}

double padding_fraction(const std::vector<DocumentBin>& bins, int64_t capacity) {
  if (bins.empty()) return 0.0;
  int64_t used = 0;
  for (const DocumentBin& bin : bins) {
    for (const DocumentPiece& p : bin) used += p.length;
  }
  const double total = static_cast<double>(capacity) * static_cast<double>(bins.size());
  return 1.0 - static_cast<double>(used) / total;
}

}  // namespace dstrain::data
