#include "tokenizer/nfc.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <vector>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace dstrain::tokenizer {
namespace {

void check(UErrorCode status, const char* step) {
  if (U_FAILURE(status))
    fail(ErrorKind::kInternal, "NFC normalization: {} failed: {}", step, u_errorName(status));
}

std::vector<UChar> to_utf16(std::string_view text) {
  std::vector<UChar> out(text.size() + 1);  // UTF-16 never needs more units than UTF-8 bytes
  UErrorCode status = U_ZERO_ERROR;
  int32_t len = 0;
  u_strFromUTF8(out.data(), static_cast<int32_t>(out.size()), &len, text.data(),
                static_cast<int32_t>(text.size()), &status);
  check(status, "u_strFromUTF8");
  out.resize(static_cast<size_t>(len));
  return out;
}

std::string to_utf8(const std::vector<UChar>& text) {
  std::string out(text.size() * 3, '\0');  // at most 3 bytes per UTF-16 unit
  UErrorCode status = U_ZERO_ERROR;
  int32_t len = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &len, text.data(),
              static_cast<int32_t>(text.size()), &status);
  check(status, "u_strToUTF8");
  out.resize(static_cast<size_t>(len));
  return out;
}

}  // namespace

std::string nfc(std::string_view text) {
  if (is_ascii(text)) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* normalizer = unorm2_getNFCInstance(&status);
  check(status, "unorm2_getNFCInstance");
  const std::vector<UChar> src = to_utf16(text);
  const auto src_len = static_cast<int32_t>(src.size());
  if (unorm2_spanQuickCheckYes(normalizer, src.data(), src_len, &status) == src_len) {
    check(status, "unorm2_spanQuickCheckYes");
    return std::string(text);
  }
  // Composition never lengthens by much; grow once if ICU says the buffer was short.
  std::vector<UChar> dst(src.size() * 2 + 16);
  status = U_ZERO_ERROR;
  int32_t len = unorm2_normalize(normalizer, src.data(), src_len, dst.data(),
                                 static_cast<int32_t>(dst.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    dst.resize(static_cast<size_t>(len));
    status = U_ZERO_ERROR;
    len = unorm2_normalize(normalizer, src.data(), src_len, dst.data(), len, &status);
  }
  check(status, "unorm2_normalize");
  dst.resize(static_cast<size_t>(len));
  return to_utf8(dst);
}

}  // namespace dstrain::tokenizer
