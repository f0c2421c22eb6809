#include "tokenizer/bpe_tokenizer.h"

#include <algorithm>

#include "core/error.h"

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
  added_content_ = added_contents(spec.added, vocab_size_);
}

std::vector<int32_t> ByteLevelBpeTokenizer::encode(std::string_view text) const {
  check_text_is_utf8(text);
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
