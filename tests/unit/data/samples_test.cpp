#include <gtest/gtest.h>

#include "data/batch.h"
#include "data/datasets.h"
#include "data/samples.h"
#include "test_util.h"

namespace dstrain::data {
namespace {

using testing::BytesTokenizer;
using testing::expect_error;
using testing::TempDir;
constexpr int64_t kEos = BytesTokenizer::kEos;
constexpr int64_t kPad = BytesTokenizer::kPad;

// Documents {1,2,3}, {4,5}, {6,7,8,9,10,11} as a corpus.
std::shared_ptr<Corpus> small_corpus() {
  auto c = std::make_shared<Corpus>();
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3}, {4, 5}, {6, 7, 8, 9, 10, 11}};
  for (const auto& d : docs) c->add_document(d.data(), static_cast<int64_t>(d.size()));
  return c;
}

SampleOptions opts(int64_t t, Packing packing, bool partial = false) {
  SampleOptions o;
  o.max_length = t;
  o.packing = packing;
  o.keep_partial_window = partial;
  o.eos_id = static_cast<int32_t>(kEos);
  o.pad_id = static_cast<int32_t>(kPad);
  return o;
}

std::pair<std::vector<int64_t>, std::vector<int64_t>> sample(const SampleSet& s, int64_t i) {
  std::vector<int64_t> in(s.max_length()), lab(s.max_length());
  s.fill(i, in.data(), lab.data());
  return {in, lab};
}

// Whole documents per sample: sequences 1 2 3 eos (3 positions), 4 5 eos (2), 6..11 eos (6) with
// T = 5 in one window: the 6-position sequence is split into 5 + 1 (the pieces sharing token 11);
// first-fit decreasing: 5 fills sample 0, 3 opens sample 1, 2 fills it, 1 opens sample 2. Each
// piece's labels are its own document's next tokens; padding is one more document.
TEST(DocumentSamples, WholeDocumentsPerSampleLabelsInsideEachAndTheirLengths) {
  SampleOptions o = opts(5, Packing::kDocuments);
  SampleSet s(small_corpus(), {0, 1, 2}, o, "mem");
  ASSERT_EQ(s.size(), 3);
  std::vector<int64_t> in(5), lab(5), lengths;
  EXPECT_EQ(s.fill(0, in.data(), lab.data(), &lengths), 5);
  EXPECT_EQ(in, (std::vector<int64_t>{6, 7, 8, 9, 10}));
  EXPECT_EQ(lab, (std::vector<int64_t>{7, 8, 9, 10, 11}));
  EXPECT_EQ(lengths, (std::vector<int64_t>{5}));
  s.fill(1, in.data(), lab.data(), &lengths);
  EXPECT_EQ(in, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(lab, (std::vector<int64_t>{2, 3, kEos, 5, kEos}));
  EXPECT_EQ(lengths, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(s.fill(2, in.data(), lab.data(), &lengths), 1);
  EXPECT_EQ(in, (std::vector<int64_t>{11, kPad, kPad, kPad, kPad}));
  EXPECT_EQ(lab, (std::vector<int64_t>{kEos, -100, -100, -100, -100}));
  EXPECT_EQ(lengths, (std::vector<int64_t>{1, 4}));
  // T = 6: the long document whole in sample 0; 3 + 2 and one position of padding in sample 1.
  o.max_length = 6;
  SampleSet wider(small_corpus(), {0, 1, 2}, o, "mem");
  ASSERT_EQ(wider.size(), 2);
  std::vector<int64_t> in6(6), lab6(6);
  wider.fill(1, in6.data(), lab6.data(), &lengths);
  EXPECT_EQ(in6, (std::vector<int64_t>{1, 2, 3, 4, 5, kPad}));
  EXPECT_EQ(lab6, (std::vector<int64_t>{2, 3, kEos, 5, kEos, -100}));
  EXPECT_EQ(lengths, (std::vector<int64_t>{3, 2, 1}));
  EXPECT_DOUBLE_EQ(wider.padding_fraction(), 1.0 / 12.0);
  // Truncated instead: 6..11 eos keeps its first 5 positions; nothing is left for a third sample.
  o.max_length = 5;
  o.long_documents = LongDocuments::kTruncate;
  SampleSet cut(small_corpus(), {0, 1, 2}, o, "mem");
  EXPECT_EQ(cut.size(), 2);
  // A batch carries each row's document lengths, a filler row one document of T, and counts its
  // tokens and labels.
  const Batch b = collate(s, {1, 2, -1}, false);
  EXPECT_EQ(b.documents, (std::vector<std::vector<int64_t>>{{3, 2}, {1, 4}, {5}}));
  EXPECT_EQ(b.tokens, 6);
  EXPECT_EQ(b.labelled, 6);
  EXPECT_TRUE(
      collate(SampleSet(small_corpus(), {0, 1, 2}, opts(5, Packing::kStream), "mem"), {0}, false)
          .documents.empty());
}

TEST(PadSamples, ShiftedLabelsWithEosAndMinus100OnPadding) {
  SampleSet s(small_corpus(), {0, 1, 2}, opts(5, Packing::kPad), "mem");
  ASSERT_EQ(s.size(), 3);
  EXPECT_DOUBLE_EQ(s.padding_fraction(), 1.0 - (3.0 + 2.0 + 5.0) / 15.0);
  auto [in0, lab0] = sample(s, 0);  // 1 2 3 eos → inputs 1 2 3, labels 2 3 eos
  EXPECT_EQ(in0, (std::vector<int64_t>{1, 2, 3, kPad, kPad}));
  EXPECT_EQ(lab0, (std::vector<int64_t>{2, 3, kEos, -100, -100}));
  auto [in2, lab2] = sample(s, 2);  // 6..11 eos truncated to T+1 = 6 tokens
  EXPECT_EQ(in2, (std::vector<int64_t>{6, 7, 8, 9, 10}));
  EXPECT_EQ(lab2, (std::vector<int64_t>{7, 8, 9, 10, 11}));
}

TEST(PadSamples, DocumentsWithoutALabelAreSkipped) {
  auto c = std::make_shared<Corpus>();
  c->add_document(nullptr, 0);  // empty: only eos → nothing to predict
  const int32_t one = 7;
  c->add_document(&one, 1);  // 7 eos → one label
  SampleSet s(c, {0, 1}, opts(4, Packing::kPad), "mem");
  ASSERT_EQ(s.size(), 1);
  auto [in, lab] = sample(s, 0);
  EXPECT_EQ(in, (std::vector<int64_t>{7, kPad, kPad, kPad}));
  EXPECT_EQ(lab, (std::vector<int64_t>{kEos, -100, -100, -100}));
}

TEST(PackSamples, ConcatenatesWithEosAndCutsOverlappingWindows) {
  // Stream: 1 2 3 E 4 5 E 6 7 8 9 10 11 E  (L = 14), T = 4 → floor(13/4) = 3 windows.
  SampleSet s(small_corpus(), {0, 1, 2}, opts(4, Packing::kStream), "mem");
  ASSERT_EQ(s.size(), 3);
  auto [in0, lab0] = sample(s, 0);
  EXPECT_EQ(in0, (std::vector<int64_t>{1, 2, 3, kEos}));
  EXPECT_EQ(lab0, (std::vector<int64_t>{2, 3, kEos, 4}));
  auto [in1, lab1] = sample(s, 1);
  EXPECT_EQ(in1, (std::vector<int64_t>{4, 5, kEos, 6}));
  EXPECT_EQ(lab1, (std::vector<int64_t>{5, kEos, 6, 7}));
  auto [in2, lab2] = sample(s, 2);
  EXPECT_EQ(in2, (std::vector<int64_t>{7, 8, 9, 10}));
  EXPECT_EQ(lab2, (std::vector<int64_t>{8, 9, 10, 11}));
}

TEST(PackSamples, PartialWindowKeptForEvalWithMinus100) {
  SampleSet s(small_corpus(), {0, 1, 2}, opts(4, Packing::kStream, true), "mem");
  ASSERT_EQ(s.size(), 4);
  EXPECT_DOUBLE_EQ(s.padding_fraction(), 1.0 - 13.0 / 16.0);  // 13 labels in 4 windows of 4
  auto [in, lab] = sample(s, 3);                              // stream tokens 12..13: 11 E
  EXPECT_EQ(in, (std::vector<int64_t>{11, kPad, kPad, kPad}));
  EXPECT_EQ(lab, (std::vector<int64_t>{kEos, -100, -100, -100}));
}

TEST(PackSamples, EveryStreamTokenIsALabelExactlyOnce) {
  auto c = std::make_shared<Corpus>();
  std::vector<int32_t> d(100);
  for (int i = 0; i < 100; ++i) d[i] = i;
  for (int k = 0; k < 7; ++k) c->add_document(d.data() + k * 13, 13);
  SampleSet s(c, {0, 1, 2, 3, 4, 5, 6}, opts(8, Packing::kStream, true), "mem");
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < s.size(); ++i) {
    for (int64_t l : sample(s, i).second) {
      if (l != -100) labels.push_back(l);
    }
  }
  std::vector<int64_t> expected;  // stream without its first token
  for (int k = 0; k < 7; ++k) {
    for (int j = 0; j < 13; ++j) {
      if (k + j > 0) expected.push_back(k * 13 + j);
    }
    expected.push_back(kEos);
  }
  EXPECT_EQ(labels, expected);
}

TEST(PackSamples, DocumentSubsetIsUsedInGivenOrder) {
  SampleSet s(small_corpus(), {1}, opts(2, Packing::kStream), "mem");  // stream 4 5 E → 1 window
  ASSERT_EQ(s.size(), 1);
  EXPECT_EQ(sample(s, 0).second, (std::vector<int64_t>{5, kEos}));
}

TEST(Collate, BatchTensorsAreInt64WithFillerRows) {
  SampleSet s(small_corpus(), {0, 1, 2}, opts(4, Packing::kStream), "mem");
  Batch b = collate(s, {2, -1}, /*pin_memory=*/true);  // pinning is a no-op without CUDA
  EXPECT_EQ(b.input_ids.dtype(), torch::kInt64);
  EXPECT_EQ(b.input_ids.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(b.labels.sizes(), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(b.num_rows, 1);
  EXPECT_EQ(b.input_ids[0][0].item<int64_t>(), 7);
  EXPECT_TRUE(b.labels[1].eq(-100).all().item<bool>());
  EXPECT_TRUE(b.input_ids[1].eq(kPad).all().item<bool>());
}

TEST(BuildDatasets, EvalSplitIsDeterministicDisjointAndByDocuments) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 40; ++i) text += "document number " + std::to_string(i) + "\n";
  DataOptions o;
  o.train_path = dir.write("t.txt", text);
  o.document = "line";
  o.packing = Packing::kPad;
  o.max_length = 32;
  o.eval_split = 0.1;
  BytesTokenizer tok;
  Datasets a = build_datasets(o, tok), b = build_datasets(o, tok);
  ASSERT_TRUE(a.eval);
  EXPECT_EQ(a.eval->size(), 4);
  EXPECT_EQ(a.train->size(), 36);
  auto first_ids = [](const SampleSet& s) {
    std::vector<std::vector<int64_t>> out;
    for (int64_t i = 0; i < s.size(); ++i) out.push_back(sample(s, i).first);
    return out;
  };
  EXPECT_EQ(first_ids(*a.eval), first_ids(*b.eval));
  auto train = first_ids(*a.train);
  for (const auto& e : first_ids(*a.eval)) {
    EXPECT_EQ(std::count(train.begin(), train.end(), e), 0);
  }
  o.seed = 7;
  EXPECT_NE(first_ids(*build_datasets(o, tok).eval), first_ids(*a.eval));
}

TEST(BuildDatasets, EvalPathGivesEvalSetWithPartialWindow) {
  TempDir dir;
  DataOptions o;
  o.train_path = dir.write("train.txt", std::string(100, 'a'));
  o.eval_path = dir.write("eval.jsonl", "{\"text\": \"bbbbbbb\"}\n");  // 7 + eos = 8 tokens
  o.max_length = 4;
  Datasets d = build_datasets(o, BytesTokenizer());
  EXPECT_EQ(d.train->size(), 25);  // 101 tokens → floor(100/4)
  ASSERT_TRUE(d.eval);
  EXPECT_EQ(d.eval->size(), 2);  // 7 labels → one full window, one partial
}

TEST(BuildDatasets, EmptyDatasetIsInputError) {
  TempDir dir;
  DataOptions o;
  o.train_path = dir.write("j.jsonl", "{\"text\": \"\"}\n");
  expect_error([&] { build_datasets(o, BytesTokenizer()); }, ErrorKind::kInput,
               {o.train_path, "empty", "no tokens"});
}

}  // namespace
}  // namespace dstrain::data
