#include "tokenizer/sentencepiece_bpe_tokenizer.h"

#include <algorithm>

#include "core/error.h"

namespace dstrain::tokenizer {
namespace {

std::vector<AddedToken> added_tokens(const BpeSpec& spec, bool normalized) {
  const Normalizer normalizer(spec.normalizer);
  std::vector<AddedToken> out;
  for (const AddedToken& t : spec.added) {
    if (t.normalized != normalized) continue;
    out.push_back(t);
    if (normalized) out.back().content = normalizer.apply(t.content);
  }
  return out;
}

}  // namespace

SentencePieceBpeTokenizer::SentencePieceBpeTokenizer(const BpeSpec& spec)
    : model_(spec),
      raw_added_(added_tokens(spec, false)),
      normalized_added_(added_tokens(spec, true)),
      normalizer_(spec.normalizer),
      metaspace_(spec.metaspace),
      decoder_(spec.decoder),
      vocab_size_(model_.size()),
      eos_(spec.eos),
      bos_(spec.bos),
      pad_(spec.pad),
      post_processor_prefix_(spec.post_processor_prefix) {
  added_content_ = added_contents(spec.added, vocab_size_);
}

std::vector<int32_t> SentencePieceBpeTokenizer::encode(std::string_view text) const {
  check_text_is_utf8(text);
  std::vector<Segment> segments;
  raw_added_.split(text, segments);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else {
      encode_stretch(seg.text, seg.text.data() == text.data(), ids);
    }
  }
  return ids;
}

// Steps 3 and 4: normalize, then cut out the normalized added tokens.
void SentencePieceBpeTokenizer::encode_stretch(std::string_view text, bool at_start,
                                               std::vector<int32_t>& out) const {
  const std::string normalized = normalizer_.apply(text);
  std::vector<Segment> segments;
  normalized_added_.split(normalized, segments);
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].id >= 0) {
      out.push_back(segments[i].id);
    } else {
      encode_pretokens(segments[i].text, at_start && i == 0, out);
    }
  }
}

// Steps 5 and 6.
void SentencePieceBpeTokenizer::encode_pretokens(std::string_view text, bool at_start,
                                                 std::vector<int32_t>& out) const {
  if (!metaspace_) {
    model_.encode_piece(text, out);
    return;
  }
  thread_local std::vector<std::string> pieces;
  pieces.clear();
  metaspace_pieces(*metaspace_, text, at_start, pieces);
  for (const std::string& piece : pieces) model_.encode_piece(piece, out);
}

std::string SentencePieceBpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id >= 0 && id < vocab_size_ && !added_content_[id].empty()) {
      tokens.push_back(added_content_[id]);
    } else if (const std::string* text = model_.token_text(id)) {
      tokens.push_back(*text);
    } else {
      fail(ErrorKind::kInput,
           "cannot decode token id {} at position {}: the vocabulary has ids "
           "0..{} and no token with this id",
           id, i, vocab_size_ - 1);
    }
  }
  return decoder_.decode(std::move(tokens));
}

}  // namespace dstrain::tokenizer
