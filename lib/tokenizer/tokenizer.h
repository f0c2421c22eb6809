#pragma once
// A tokenizer turns text into token ids and back. Implementations: ByteLevelBpeTokenizer (GPT-2,
// Qwen2, Llama 3 style files), SentencePieceBpeTokenizer (Llama 2, Mistral, TinyLlama style files)
// and ByteTokenizer (256 byte ids + eos + pad, for the built-in demo).
// Thread-safety: encode/decode are const and safe to call from several threads at once.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Invalid UTF-8 in `text` is Error(kInput) naming the byte offset (see docs/tokenizers.md).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // highest id + 1, added tokens included
  virtual std::optional<int32_t> eos_id() const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> pad_id() const = 0;
  // The ids the tokenizer's post-processor puts before a single text, as transformers'
  // `tokenizer(text)` does (Llama 2/3, Mistral: the bos). encode() never adds them; the data
  // pipeline does, per data.add_bos (tokenizer/document_prefix.h).
  virtual std::vector<int32_t> post_processor_prefix() const { return {}; }
};

// "byte" → ByteTokenizer; a directory with tokenizer.json, or vocab.json + merges.txt → BPE
// (byte-level, or SentencePiece-style when tokenizer.json has no ByteLevel pre-tokenizer).
// Error(kInput) naming the directory and the files looked for when none is usable, or the file and
// key of a component that is not supported.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name_or_dir);

}  // namespace dstrain::tokenizer
