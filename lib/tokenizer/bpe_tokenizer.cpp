#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "core/utf8.h"

namespace dstrain::tokenizer {

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(const BpeSpec& spec)
    : model_(spec),
      added_(spec.added),
      split_(spec.split_pattern, spec.split_literal, spec.split_origin),
      normalizer_(spec.normalizer),
      vocab_size_(model_.size()),
      eos_(spec.eos),
      bos_(spec.bos),
      pad_(spec.pad),
      post_processor_prefix_(spec.post_processor_prefix) {
  for (const AddedToken& t : spec.added) {
    if (t.id < 0) fail(ErrorKind::kInput, "added token '{}' has negative id {}", t.content, t.id);
    vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{t.id} + 1);
  }
  added_content_.resize(static_cast<size_t>(vocab_size_));
  for (const AddedToken& t : spec.added) added_content_[t.id] = t.content;
}

std::vector<int32_t> ByteLevelBpeTokenizer::encode(std::string_view text) const {
  if (const std::optional<size_t> bad = find_invalid_utf8(text)) {
    fail(ErrorKind::kInput,
         "invalid UTF-8 at byte offset {} of the text to tokenize (byte 0x{:02X}); "
         "expected UTF-8 text",
         *bad, static_cast<unsigned char>(text[*bad]));
  }
  std::vector<Segment> segments;
  added_.split(text, segments);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  for (const Segment& seg : segments) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
    } else if (normalizer_.empty()) {
      encode_segment(seg.text, ids);
    } else {
      encode_segment(normalizer_.apply(seg.text), ids);
    }
  }
  return ids;
}

void ByteLevelBpeTokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<std::string_view> pieces;
  split_.split(text, pieces);
  for (std::string_view piece : pieces) model_.encode_piece(piece, out);
}

std::string ByteLevelBpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id >= 0 && id < vocab_size_ && !added_content_[id].empty()) {
      out += added_content_[id];
    } else if (const std::string* bytes = model_.token_bytes(id)) {
      out += *bytes;
    } else {
      fail(ErrorKind::kInput,
           "cannot decode token id {} at position {}: the vocabulary has ids "
           "0..{} and no token with this id",
           id, i, vocab_size_ - 1);
    }
  }
  return out;
}

}  // namespace dstrain::tokenizer
