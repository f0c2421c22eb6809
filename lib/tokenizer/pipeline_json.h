#pragma once
// Readers for the parts of a tokenizer.json around the model: normalizer, pre-tokenizer, decoder
// and post-processor. Each supported component fills the spec; any other is Error(kInput) naming
// the file, the key and the component ("tokenizer.json: normalizer.normalizers[1]: normalizer
// 'Lowercase' is not supported ..."), rather than a silently different tokenization.

#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe_spec.h"

namespace dstrain::tokenizer {

[[noreturn]] void unsupported(const std::string& origin, const std::string& what);

// null, NFC, Prepend, Replace (a String pattern), or a Sequence of those → spec.normalizer.
void read_normalizer(const nlohmann::json& n, const std::string& origin, BpeSpec& spec);

// ByteLevel, Split (Isolated), Metaspace, or a Sequence of those → spec.split_* / spec.metaspace.
// Sets `byte_level` when a ByteLevel pre-tokenizer is among them.
void read_pre_tokenizer(const nlohmann::json& p, const std::string& origin, BpeSpec& spec,
                        bool& byte_level);

// null, Replace (a String pattern), ByteFallback, Fuse, Strip, Metaspace, or a Sequence of those.
Decoder read_decoder(const nlohmann::json& d, const std::string& origin);

// The ids a post-processor puts before a single sequence: null and ByteLevel none,
// TemplateProcessing the special tokens before `$A`, RobertaProcessing/BertProcessing `cls`, and a
// Sequence what its processors put, the last one outermost.
std::vector<int32_t> read_post_processor_prefix(const nlohmann::json& p, const std::string& origin);

}  // namespace dstrain::tokenizer
