#pragma once
// Reader for the "slow tokenizer" file set: vocab.json + merges.txt (GPT-2's original names
// encoder.json + vocab.bpe are accepted too) with the optional config files of special_tokens.h.
// The split regex and normalizer are not in these files; they follow the model family named by
// tokenizer_config.json's tokenizer_class: Qwen2Tokenizer* → Qwen2's regex + NFC, else GPT-2's
// regex.

#include <filesystem>
#include <string>

#include "tokenizer/bpe_spec.h"

namespace dstrain::tokenizer {

// Error(kInput) naming the file, line or key when a file is malformed.
BpeSpec read_vocab_merges(const std::filesystem::path& dir, const std::string& vocab_name,
                          const std::string& merges_name);

}  // namespace dstrain::tokenizer
