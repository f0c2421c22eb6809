#pragma once
// SentencePiece-style BPE tokenizer (tokenizer.json of Llama 2, Mistral v0.1-v0.3, TinyLlama, as
// transformers converts a SentencePiece model). Encoding, as the reference does it:
//   1. the whole input must be well-formed UTF-8 (else Error(kInput) naming the byte offset);
//   2. added tokens matched on raw text ("normalized": false) are cut out (longest match);
//   3. each stretch between them goes through the normalizer (normalizer.h; the older files:
//      Prepend("▁") + Replace(" ", "▁"), so every stretch, also one right after an added token,
//      starts with '▁');
//   4. added tokens with "normalized": true are cut out of the normalized stretch (their content
//      normalized the same way first);
//   5. the Metaspace pre-tokenizer, when there is one, turns spaces into '▁', prepends one by its
//      prepend_scheme and may split before each '▁' (metaspace.h); without it the stretch is one
//      pre-token;
//   6. each pre-token goes through the character-level BPE model with byte fallback
//      (char_bpe_model.h).
// Decoding maps each id to its token (an added token to its content) and runs the file's decoder
// (decoder.h), so the text is the reference's `decode(ids, skip_special_tokens=False)`.

#include "tokenizer/added_tokens.h"
#include "tokenizer/bpe_spec.h"
#include "tokenizer/char_bpe_model.h"
#include "tokenizer/tokenizer.h"

namespace dstrain::tokenizer {

class SentencePieceBpeTokenizer : public Tokenizer {
 public:
  // Validates the spec (Error(kInput) naming the file at fault).
  explicit SentencePieceBpeTokenizer(const BpeSpec& spec);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> pad_id() const override { return pad_; }
  std::vector<int32_t> post_processor_prefix() const override { return post_processor_prefix_; }

 private:
  void encode_stretch(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void encode_pretokens(std::string_view text, bool at_start, std::vector<int32_t>& out) const;

  CharBpeModel model_;
  AddedTokenMatcher raw_added_;         // "normalized": false
  AddedTokenMatcher normalized_added_;  // "normalized": true, contents normalized
  Normalizer normalizer_;
  std::optional<MetaspaceSpec> metaspace_;
  Decoder decoder_;
  std::vector<std::string> added_content_;  // by id; empty where the id is not an added token
  int64_t vocab_size_;
  std::optional<int32_t> eos_, bos_, pad_;
  std::vector<int32_t> post_processor_prefix_;
};

}  // namespace dstrain::tokenizer
