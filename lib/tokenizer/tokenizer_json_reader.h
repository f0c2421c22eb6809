#pragma once
// Reader for a Hugging Face tokenizer.json holding a byte-level BPE model:
//   model            {type: "BPE", vocab: {token: id}, merges: ["a b", ...] or [["a","b"], ...],
//                     ignore_merges?}
//   added_tokens     [{id, content, special}, ...]
//   normalizer       null, NFC, or a Sequence of those
//   pre_tokenizer    ByteLevel (use_regex → GPT-2's regex), or a Sequence of Split {pattern:
//                     {Regex|String}, behavior: Isolated, invert: false} and ByteLevel {use_regex:
//                     false}
// Anything else (other models, normalizers or pre-tokenizers, add_prefix_space) is Error(kInput)
// naming the key, rather than a silently different tokenization. The post_processor and decoder are
// not read: encode never adds bos/eos, and decoding is byte-level. eos/bos/pad come from the config
// files beside tokenizer.json (see special_tokens.h).

#include <filesystem>

#include "tokenizer/bpe_spec.h"

namespace dstrain::tokenizer {

BpeSpec read_tokenizer_json(const std::filesystem::path& file);

}  // namespace dstrain::tokenizer
