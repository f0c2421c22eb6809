#pragma once
// Reader for a Hugging Face tokenizer.json holding a BPE model, of one of two kinds:
//   byte-level (GPT-2, Qwen2, Llama 3): pre_tokenizer ByteLevel (use_regex → GPT-2's regex), or a
//     Sequence of Split {pattern: {Regex|String}, behavior: Isolated, invert: false} and ByteLevel
//     {use_regex: false}; the decoder is not read (decoding is byte-level);
//   SentencePiece-style (Llama 2, Mistral, TinyLlama): no ByteLevel; pre_tokenizer null or
//     Metaspace {replacement, prepend_scheme, split}; decoder read (decoder.h).
// Both: model {type: "BPE", vocab: {token: id}, merges: ["a b", ...] or [["a","b"], ...],
//   ignore_merges?, byte_fallback?, unk_token?, fuse_unk?}; added_tokens [{id, content, special,
//   normalized}]; normalizer null, NFC, Prepend, Replace (String pattern) or a Sequence of those;
//   post_processor (the ids it puts before a single sequence, see pipeline_json.h).
// Anything else (other models, normalizers, pre-tokenizers, decoders, post-processors,
// add_prefix_space on ByteLevel, BPE dropout) is Error(kInput) naming the file, the key and the
// component, rather than a silently different tokenization. eos/bos/pad come from the config files
// beside tokenizer.json (see special_tokens.h).

#include <filesystem>

#include "tokenizer/bpe_spec.h"

namespace dstrain::tokenizer {

BpeSpec read_tokenizer_json(const std::filesystem::path& file);

}  // namespace dstrain::tokenizer
