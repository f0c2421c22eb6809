#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/split_regex.h"

#include <pcre2.h>

#include "core/error.h"

namespace dstrain::tokenizer {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

// One match data block per thread, sized for any pattern (the split patterns use no captures).
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(data); }
  };
  thread_local Holder holder;
  return holder.data;
}

}  // namespace

SplitRegex::SplitRegex(const std::string& pattern, bool literal, const std::string& origin) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err,
                        &err_offset, nullptr);
  if (code_ == nullptr) {
    fail(ErrorKind::kInput, "{}: the split regex does not compile at offset {}: {}", origin,
         err_offset, pcre2_message(err));
  }
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

SplitRegex::~SplitRegex() {
  pcre2_code_free(code_);
}

void SplitRegex::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  pcre2_match_data* md = thread_match_data();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  size_t gap_start = 0;
  while (pos < text.size()) {
    const int rc =
        jit_ ? pcre2_jit_match(code_, subject, text.size(), pos, 0, md, nullptr)
             : pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      fail(ErrorKind::kInput, "the split regex failed at byte offset {} of the input: {}", pos,
           pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0], end = ov[1];
    if (begin > gap_start) pieces.push_back(text.substr(gap_start, begin - gap_start));
    if (end > begin) pieces.push_back(text.substr(begin, end - begin));
    gap_start = end;
    // An empty match must not stall the scan: step over one whole UTF-8 character.
    pos = end > begin ? end : end + 1;
    while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
  }
  if (gap_start < text.size()) pieces.push_back(text.substr(gap_start));
}

}  // namespace dstrain::tokenizer
