#pragma once
// The ids put before each document (config key data.add_bos), so that dstrain's documents are the
// ids of transformers' `tokenizer(text)` — which runs the tokenizer's post-processor — while
// Tokenizer::encode stays the plain `encode(text, add_special_tokens=False)`:
//   "auto"   the ids the post-processor puts before a single text
//   (Tokenizer::post_processor_prefix:
//            Llama 2/3, Mistral, TinyLlama: the bos; GPT-2, Qwen2: none)
//   "true"   the tokenizer's bos token; Error(kConfig) when it has none
//   "false"  none
// The eos between packed documents is the data pipeline's own (data/samples.h), whatever this is.

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dstrain::tokenizer {

// Error(kConfig) naming `key` for a value other than auto/true/false.
std::vector<int32_t> document_prefix(const Tokenizer& tokenizer, const std::string& add_bos,
                                     const std::string& key = "data.add_bos");

// `base` whose encode() returns `prefix` first; everything else is base's. `base` must outlive it.
// A cache fingerprint of it (data/token_cache.h) therefore differs from base's exactly when the
// prefix is not empty.
class PrefixedTokenizer : public Tokenizer {
 public:
  PrefixedTokenizer(const Tokenizer& base, std::vector<int32_t> prefix)
      : base_(base), prefix_(std::move(prefix)) {}

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override { return base_.decode(ids); }
  int64_t vocab_size() const override { return base_.vocab_size(); }
  std::optional<int32_t> eos_id() const override { return base_.eos_id(); }
  std::optional<int32_t> bos_id() const override { return base_.bos_id(); }
  std::optional<int32_t> pad_id() const override { return base_.pad_id(); }
  const std::vector<int32_t>& prefix() const { return prefix_; }

 private:
  const Tokenizer& base_;
  std::vector<int32_t> prefix_;
};

}  // namespace dstrain::tokenizer
