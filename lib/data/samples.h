#pragma once
// Training samples formed from a tokenized corpus, already shifted for causal language modelling:
// sample i is input_ids[T] and labels[T] with labels[t] = the token that follows input_ids[t], and
// -100 where there is nothing to predict (padding). Loss = CE(logits[:, t], labels[:, t]) ignoring
// -100, so pad tokens are never trained on.
//
// Three ways to form samples (T = max_length; "eos" is appended only when the tokenizer has one),
// data.packing's words (Packing):
//  - pad:  one sample per document. The sequence doc + eos is cut to T+1 tokens; input_ids are its
//          first n-1 tokens, labels its last n-1 (n = sequence length, at most T+1); positions past
//          n-1 hold the pad id in input_ids and -100 in labels. Tokens beyond T+1 are dropped
//          (truncation). Documents with fewer than 2 sequence tokens have no label and are skipped.
//  - stream: the documents, each followed by eos, form one stream of L tokens. Window k is stream
//          tokens [k*T, k*T + T] (T+1 tokens, consecutive windows overlap by one), so every stream
//          token after the first is a label exactly once. Attention crosses document boundaries
//          inside a window. There are floor((L-1)/T) full windows; the last incomplete one is
//          dropped unless keep_partial_window (eval), where its missing labels are -100.
//  - documents: whole documents placed into samples by
//          pack_documents() (document_bins.h), a sequence doc + eos of n tokens taking n - 1
//          positions (its inputs and labels inside the document), long ones split or truncated;
//          the rest of a sample is padding (pad id, labels -100). fill() also gives the lengths
//          of the sample's documents, the padding one more, so that each attends to itself
//          (model/document_attention.h).
// Prompt/completion documents (Corpus::prompt_lengths): a label whose token is one of the prompt's
// is -100 in every mode, so the loss counts the completion (and its eos) only.
// Samples are computed on demand from the corpus: nothing per sample is stored.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "data/document_bins.h"

namespace dstrain::data {

inline constexpr int64_t kIgnoreIndex = -100;

enum class Packing { kPad, kStream, kDocuments };

// The config's word (documents | stream | pad); Error(kConfig) naming data.packing otherwise.
Packing packing_from_word(const std::string& word);
const char* packing_word(Packing packing);
// documents: split | truncate; Error(kConfig) naming data.long_documents otherwise.
LongDocuments long_documents_from_word(const std::string& word);

struct SampleOptions {
  int64_t max_length = 1024;  // T, tokens per sample
  Packing packing = Packing::kStream;
  bool keep_partial_window = false;  // stream only: also emit the last incomplete window
  // documents: long ones split or truncated, placed by first-fit decreasing over windows of
  // `documents_window` documents.
  LongDocuments long_documents = LongDocuments::kSplit;
  int64_t documents_window = 1024;
  std::optional<int32_t> eos_id;  // appended after each document when set
  int32_t pad_id = 0;             // input_ids value at padded positions (labels are -100 there)
};

class SampleSet {
 public:
  // `documents` are indices into `corpus`, in the order they are used. `name` (the data path)
  // appears in error messages. Error(kConfig) if max_length < 1.
  SampleSet(std::shared_ptr<const Corpus> corpus, std::vector<int64_t> documents,
            const SampleOptions& options, std::string name);

  int64_t size() const { return num_samples_; }
  int64_t max_length() const { return options_.max_length; }
  int32_t pad_id() const { return options_.pad_id; }
  bool packs_documents() const { return options_.packing == Packing::kDocuments; }
  const std::string& name() const { return name_; }
  int64_t num_documents() const { return static_cast<int64_t>(documents_.size()); }

  // Writes sample `index` (0 <= index < size()) into input_ids[T] and labels[T]; with documents,
  // sets `lengths` (when given) to the lengths of its documents, summing to T. Returns the
  // positions holding a document's token (the others are padding).
  int64_t fill(int64_t index, int64_t* input_ids, int64_t* labels,
               std::vector<int64_t>* lengths = nullptr) const;
  // The share of the samples' positions that are padding.
  double padding_fraction() const { return padding_fraction_; }

 private:
  int64_t sequence_length(int64_t doc) const;  // document tokens + eos
  // Copy sequence tokens into `out`, and into `prompt` whether each is a prompt token.
  int64_t copy_stream(int64_t pos, int64_t count, int64_t* out, char* prompt) const;
  int64_t copy_document(int64_t doc, int64_t count, int64_t* out, char* prompt) const;
  int64_t fill_documents(const DocumentBin& bin, int64_t* input_ids, int64_t* labels,
                         std::vector<int64_t>* lengths) const;

  std::shared_ptr<const Corpus> corpus_;
  std::vector<int64_t> documents_;     // pad: documents with at least one label; else all given
  std::vector<int64_t> stream_start_;  // stream: [documents + 1] stream offset of each document
  std::vector<DocumentBin> bins_;      // documents: each sample's pieces (indices into documents_)
  SampleOptions options_;
  std::string name_;
  int64_t num_samples_ = 0;
  double padding_fraction_ = 0.0;
};

}  // namespace dstrain::data
