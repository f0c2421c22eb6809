#pragma once
// Unicode NFC normalization (the normalizer of Qwen2 and others), done by ICU's unorm2.

#include <string>
#include <string_view>

namespace dstrain::tokenizer {

// NFC form of well-formed UTF-8 `text`. ASCII and already-normalized text come back unchanged
// without a full normalization pass. Error(kInternal) if ICU fails (it should not on valid input).
std::string nfc(std::string_view text);

}  // namespace dstrain::tokenizer
