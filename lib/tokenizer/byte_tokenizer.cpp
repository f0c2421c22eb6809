#include "tokenizer/byte_tokenizer.h"

#include "core/error.h"

namespace dstrain::tokenizer {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id > kPad) {
      fail(ErrorKind::kInput,
           "cannot decode token id {} at position {}: the byte tokenizer has "
           "ids 0..257",
           id, i);
    }
    if (id < 256) out.push_back(static_cast<char>(id));
  }
  return out;
}

}  // namespace dstrain::tokenizer
