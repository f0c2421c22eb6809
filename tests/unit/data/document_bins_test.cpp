// data.packing: documents' placement (data/document_bins.h): first-fit decreasing per window,
// every document whole (or split into pieces of T, or truncated), no bin over T.
#include "data/document_bins.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"

namespace dstrain::data {
namespace {

using Placed = std::vector<std::vector<int64_t>>;  // per bin, its documents in placement order

Placed documents_of(const std::vector<DocumentBin>& bins) {
  Placed out;
  for (const DocumentBin& bin : bins) {
    out.emplace_back();
    for (const DocumentPiece& p : bin) out.back().push_back(p.document);
  }
  return out;
}

// Sequences of 4, 9, 3, 6 tokens (3, 8, 2, 5 positions) in the first window of 4: 8 opens bin 0,
// 5 bin 1, 3 fits only bin 1, 2 fills bin 0; the second window's 10 and 1 open bins of their own.
TEST(DocumentBins, FirstFitDecreasingWithinEachWindow) {
  const std::vector<DocumentBin> bins =
      pack_documents({4, 9, 3, 6, 11, 2}, 10, 4, LongDocuments::kSplit);
  EXPECT_EQ(documents_of(bins), (Placed{{1, 2}, {3, 0}, {4}, {5}}));
  EXPECT_DOUBLE_EQ(padding_fraction(bins, 10), 1.0 - 29.0 / 40.0);
  // One window over all: 10 fills bin 0, 8 opens bin 1, 5 bin 2, 3 fits only bin 2, 2 fills bin
  // 1, 1 joins bin 2.
  EXPECT_EQ(documents_of(pack_documents({4, 9, 3, 6, 11, 2}, 10, 6, LongDocuments::kSplit)),
            (Placed{{4}, {1, 2}, {3, 0, 5}}));
}

// A sequence longer than T + 1: pieces of T positions sharing one token (every token after the
// first a label once), or its first T positions; sequences without a label are left out.
TEST(DocumentBins, LongDocumentsAreSplitOrTruncated) {
  const std::vector<DocumentBin> split = pack_documents({11, 1}, 4, 8, LongDocuments::kSplit);
  std::vector<std::pair<int64_t, int64_t>> pieces;
  for (const DocumentBin& bin : split) {
    for (const DocumentPiece& p : bin) pieces.emplace_back(p.begin, p.length);
  }
  EXPECT_EQ(pieces, (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 4}, {8, 2}}));
  const std::vector<DocumentBin> cut = pack_documents({11, 1}, 4, 8, LongDocuments::kTruncate);
  ASSERT_EQ(cut.size(), 1u);
  EXPECT_EQ(cut[0].size(), 1u);
  EXPECT_EQ(cut[0][0].length, 4);
  EXPECT_THROW(pack_documents({3}, 0, 1, LongDocuments::kSplit), Error);
}

// Random lengths around T: every position of every document placed exactly once (split), no bin
// over T, no bin mixing windows, and the same documents give the same bins.
TEST(DocumentBins, EveryPositionOnceNoBinOverCapacityNoBinAcrossWindows) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> len(1, 300);
  std::vector<int64_t> lengths(500);
  for (int64_t& n : lengths) n = len(rng);
  const int64_t T = 128, window = 64;
  const std::vector<DocumentBin> bins = pack_documents(lengths, T, window, LongDocuments::kSplit);
  std::map<int64_t, std::set<int64_t>> covered;
  for (const DocumentBin& bin : bins) {
    int64_t used = 0;
    std::set<int64_t> windows;
    for (const DocumentPiece& p : bin) {
      used += p.length;
      windows.insert(p.document / window);
      for (int64_t i = p.begin; i < p.begin + p.length; ++i) {
        EXPECT_TRUE(covered[p.document].insert(i).second) << "position placed twice";
      }
    }
    EXPECT_LE(used, T);
    EXPECT_EQ(windows.size(), 1u);
  }
  for (size_t d = 0; d < lengths.size(); ++d) {
    EXPECT_EQ(static_cast<int64_t>(covered[static_cast<int64_t>(d)].size()),
              std::max<int64_t>(0, lengths[d] - 1))
        << "document " << d;
  }
  EXPECT_EQ(documents_of(pack_documents(lengths, T, window, LongDocuments::kSplit)),
            documents_of(bins));
  EXPECT_LT(padding_fraction(bins, T), 0.1) << "first-fit decreasing should fill the bins";
}

}  // namespace
}  // namespace dstrain::data
