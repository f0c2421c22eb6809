#pragma once
// Byte-level BPE tokenizer (GPT-2, Qwen2, Llama 3 style). Encoding:
//   1. the whole input must be well-formed UTF-8 (else Error(kInput) naming the byte offset);
//   2. added tokens are cut out of the raw text (longest match, never split);
//   3. each remaining segment goes through the normalizer (normalizer.h; NFC for Qwen2);
//   4. the split regex cuts it into pre-tokens;
//   5. each pre-token's bytes go through ranked BPE merges (with a shared cache).
// Decoding concatenates the bytes of each id (added tokens give their content) and returns them as
// is, so decode(encode(x)) == x for NFC text even when the ids are cut mid-character elsewhere.

#include <memory>

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_model.h"
#include "tokenizer/bpe_spec.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/split_regex.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::tokenizer {

class ByteLevelBpeTokenizer : public Tokenizer {
 public:
  // Validates the spec (Error(kInput) naming the file at fault).
  explicit ByteLevelBpeTokenizer(const BpeSpec& spec);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> pad_id() const override { return pad_; }
  std::vector<int32_t> post_processor_prefix() const override { return post_processor_prefix_; }

 private:
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;

  BpeModel model_;
  AddedTokenMatcher added_;
  SplitRegex split_;
  Normalizer normalizer_;
  std::vector<std::string> added_content_;  // by id; empty where the id is not an added token
  int64_t vocab_size_;
  std::optional<int32_t> eos_, bos_, pad_;
  std::vector<int32_t> post_processor_prefix_;
};

}  // namespace dstrain::tokenizer
