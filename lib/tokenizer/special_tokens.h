#pragma once
// Special and added tokens from the Hugging Face config files next to the vocabulary:
//   tokenizer_config.json   added_tokens_decoder {id: {content, special}}, eos_token, bos_token,
//                           pad_token, additional_special_tokens (strings or {content: ...}
//                           objects)
//   added_tokens.json       {content: id}
//   special_tokens_map.json the same token keys; used only where tokenizer_config.json has none
// Every eos/bos/pad/additional special token becomes an added token (matched on raw text, never
// split), even when it lives in the main vocabulary (GPT-2's "<|endoftext|>").
// Without tokenizer_config.json and special_tokens_map.json, a vocabulary holding "<|endoftext|>"
// gets it as eos and bos (GPT-2's convention).

#include <filesystem>

#include "tokenizer/bpe_spec.h"

namespace dstrain::tokenizer {

// Adds the directory's added tokens to spec.added and sets spec.eos/bos/pad. Error(kInput) naming
// the file and key when a file is malformed or names a token that has no id.
void read_special_tokens(const std::filesystem::path& dir, BpeSpec& spec);

}  // namespace dstrain::tokenizer
