#pragma once
// The plain byte tokenizer of the built-in demo: ids 0..255 are the bytes themselves, 256 is eos
// and 257 is pad. Any byte string encodes (no UTF-8 requirement); eos and pad decode to nothing.

#include "tokenizer/tokenizer.h"

namespace dstrain::tokenizer {

class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int32_t kEos = 256;
  static constexpr int32_t kPad = 257;

  std::vector<int32_t> encode(std::string_view text) const override;
  // Error(kInput) for an id outside 0..257.
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 258; }
  std::optional<int32_t> eos_id() const override { return kEos; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::optional<int32_t> pad_id() const override { return kPad; }
};

}  // namespace dstrain::tokenizer
