#include "data/samples.h"

#include <algorithm>

#include "core/error.h"

namespace dstrain::data {

Packing packing_from_word(const std::string& word) {
  if (word == "documents") return Packing::kDocuments;
  if (word == "stream") return Packing::kStream;
  if (word == "pad") return Packing::kPad;
  fail(ErrorKind::kConfig, "data.packing: expected documents, stream or pad, got {}", word);
}

const char* packing_word(Packing packing) {
  switch (packing) {
    case Packing::kDocuments:
      return "documents";
    case Packing::kStream:
      return "stream";
    case Packing::kPad:
      return "pad";
  }
  return "?";
}

LongDocuments long_documents_from_word(const std::string& word) {
  if (word == "split") return LongDocuments::kSplit;
  if (word == "truncate") return LongDocuments::kTruncate;
  fail(ErrorKind::kConfig, "data.long_documents: expected split or truncate, got {}", word);
}

SampleSet::SampleSet(std::shared_ptr<const Corpus> corpus, std::vector<int64_t> documents,
                     const SampleOptions& options, std::string name)
    : corpus_(std::move(corpus)), options_(options), name_(std::move(name)) {
  if (options_.max_length < 1) {
    fail(ErrorKind::kConfig, "data.max_length: must be at least 1, got {}", options_.max_length);
  }
  const int64_t t = options_.max_length;
  if (options_.packing == Packing::kDocuments) {
    documents_ = std::move(documents);
    std::vector<int64_t> lengths;
    lengths.reserve(documents_.size());
    for (int64_t d : documents_) lengths.push_back(sequence_length(d));
    bins_ = pack_documents(lengths, t, options_.documents_window, options_.long_documents);
    num_samples_ = static_cast<int64_t>(bins_.size());
    padding_fraction_ = data::padding_fraction(bins_, t);
    return;
  }
  if (options_.packing == Packing::kPad) {
    int64_t positions = 0;
    for (int64_t d : documents) {
      const int64_t n = sequence_length(d);
      if (n < 2) continue;
      documents_.push_back(d);
      positions += std::min(n - 1, t);
    }
    num_samples_ = static_cast<int64_t>(documents_.size());
    if (num_samples_ > 0) {
      padding_fraction_ =
          1.0 - static_cast<double>(positions) / static_cast<double>(num_samples_ * t);
    }
    return;
  }
  documents_ = std::move(documents);
  stream_start_.reserve(documents_.size() + 1);
  stream_start_.push_back(0);
  for (int64_t d : documents_) stream_start_.push_back(stream_start_.back() + sequence_length(d));
  const int64_t labels = std::max<int64_t>(0, stream_start_.back() - 1);
  num_samples_ = labels / t + ((options_.keep_partial_window && labels % t != 0) ? 1 : 0);
  if (num_samples_ > 0) {
    padding_fraction_ = 1.0 - static_cast<double>(std::min(labels, num_samples_ * t)) /
                                  static_cast<double>(num_samples_ * t);
  }
}

int64_t SampleSet::sequence_length(int64_t doc) const {
  return corpus_->document_length(doc) + (options_.eos_id ? 1 : 0);
}

int64_t SampleSet::copy_document(int64_t doc, int64_t count, int64_t* out, char* prompt) const {
  const int64_t n = std::min(count, sequence_length(doc));
  const int64_t from_doc = std::min(n, corpus_->document_length(doc));
  std::copy_n(corpus_->document_data(doc), from_doc, out);
  if (n > from_doc) out[from_doc] = *options_.eos_id;
  const int64_t prompt_length = corpus_->prompt_length(doc);
  for (int64_t k = 0; k < n; ++k) prompt[k] = k < prompt_length ? 1 : 0;
  return n;
}

// Copies up to `count` stream tokens starting at stream position `pos`; returns how many there
// were.
int64_t SampleSet::copy_stream(int64_t pos, int64_t count, int64_t* out, char* prompt) const {
  auto it = std::upper_bound(stream_start_.begin(), stream_start_.end(), pos);
  int64_t j = static_cast<int64_t>(it - stream_start_.begin()) - 1;
  int64_t skip = pos - stream_start_[j];
  int64_t done = 0;
  for (; done < count && j < num_documents(); ++j, skip = 0) {
    const int64_t doc = documents_[j];
    const int64_t len = sequence_length(doc);
    const int64_t prompt_length = corpus_->prompt_length(doc);
    for (int64_t k = skip; k < len && done < count; ++k, ++done) {
      out[done] =
          k < corpus_->document_length(doc) ? corpus_->document_data(doc)[k] : *options_.eos_id;
      prompt[done] = k < prompt_length ? 1 : 0;
    }
  }
  return done;
}

int64_t SampleSet::fill(int64_t index, int64_t* input_ids, int64_t* labels,
                        std::vector<int64_t>* lengths) const {
  if (index < 0 || index >= num_samples_) {
    fail(ErrorKind::kInternal, "sample index {} out of range [0, {}) in {}", index, num_samples_,
         name_);
  }
  const int64_t t = options_.max_length;
  if (options_.packing == Packing::kDocuments) {
    return fill_documents(bins_[static_cast<size_t>(index)], input_ids, labels, lengths);
  }
  std::vector<int64_t> window(t + 1);
  std::vector<char> prompt(t + 1);
  const int64_t n = options_.packing == Packing::kStream
                        ? copy_stream(index * t, t + 1, window.data(), prompt.data())
                        : copy_document(documents_[index], t + 1, window.data(), prompt.data());
  for (int64_t i = 0; i < t; ++i) {
    const bool real = i + 1 < n;
    input_ids[i] = real ? window[i] : options_.pad_id;
    labels[i] = real && prompt[i + 1] == 0 ? window[i + 1] : kIgnoreIndex;
  }
  return std::max<int64_t>(0, n - 1);
}

// A piece takes sequence tokens [begin, begin + length] of its document: inputs the first
// `length`, labels the last `length`.
int64_t SampleSet::fill_documents(const DocumentBin& bin, int64_t* input_ids, int64_t* labels,
                                  std::vector<int64_t>* lengths) const {
  const int64_t t = options_.max_length;
  if (lengths) lengths->clear();
  int64_t at = 0;
  for (const DocumentPiece& p : bin) {
    const int64_t doc = documents_[static_cast<size_t>(p.document)];
    const auto* data = corpus_->document_data(doc);
    const int64_t n = corpus_->document_length(doc);
    const int64_t prompt_length = corpus_->prompt_length(doc);
    // The sequence's token k: the document's, then eos (pieces end within the sequence).
    const auto token = [&](int64_t k) -> int64_t { return k < n ? data[k] : *options_.eos_id; };
    for (int64_t i = 0; i < p.length; ++i) {
      const int64_t target = p.begin + i + 1;
      input_ids[at + i] = token(p.begin + i);
      labels[at + i] = target < prompt_length ? kIgnoreIndex : token(target);
    }
    at += p.length;
    if (lengths) lengths->push_back(p.length);
  }
  std::fill(input_ids + at, input_ids + t, options_.pad_id);
  std::fill(labels + at, labels + t, kIgnoreIndex);
  if (lengths && at < t) lengths->push_back(t - at);
  return at;
}

}  // namespace dstrain::data
