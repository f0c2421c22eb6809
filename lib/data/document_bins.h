#pragma once
// data.packing: documents — whole documents placed into samples of at most T positions, the rest
// of a sample padding (labels -100), each document attending only to itself inside its sample
// (model/document_attention.h).
//
// A document's sequence of n tokens (its tokens and eos) takes n - 1 positions of a sample: its
// first n - 1 tokens as inputs, its last n - 1 as labels, so that no label crosses into the next
// document. A sequence longer than T + 1 is split into pieces of T positions (consecutive pieces
// share one token, as the stream's windows do: every token after the first is a label once), each
// piece its own document, or truncated to its first T + 1 tokens as one-document-per-sample
// padding does (`LongDocuments`).
//
// The rule: first-fit decreasing over windows of `window` documents, in the order they come (the
// sampler's, from the seed): the pieces of a window, longest first (ties: the earlier first), each
// go into the first bin of that window with room, else into a new bin; a window's bins are
// complete when it ends, in the order they were opened. Memory is that of one window, and the
// samples follow from the documents' order alone.

#include <cstdint>
#include <vector>

namespace dstrain::data {

enum class LongDocuments { kSplit, kTruncate };

// Positions [begin, begin + length) of document `document`'s sequence (in positions: the piece's
// inputs are sequence tokens [begin, begin + length), its labels [begin + 1, begin + length]).
struct DocumentPiece {
  int64_t document = 0;  // index into the lengths given
  int64_t begin = 0;
  int64_t length = 0;
};

using DocumentBin = std::vector<DocumentPiece>;  // in placement order, back to back

// `sequence_lengths[i]`: tokens of document i's sequence (its tokens and eos), in the order the
// documents are used; a sequence of fewer than 2 tokens has no label and is left out. `capacity`:
// T >= 1; `window` >= 1. Error(kInternal) otherwise.
std::vector<DocumentBin> pack_documents(const std::vector<int64_t>& sequence_lengths,
                                        int64_t capacity, int64_t window, LongDocuments long_docs);

// The share of the bins' positions that are padding.
double padding_fraction(const std::vector<DocumentBin>& bins, int64_t capacity);

}  // namespace dstrain::data
