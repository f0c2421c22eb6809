#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/split_regex.h"

#include <pcre2.h>

#include <map>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "core/utf8.h"
#include "tokenizer/regex_classes.h"

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

// Every Unicode scalar value in order, as UTF-8 (4.3 MB).
std::string every_scalar_value() {
  std::string text;
  text.reserve(0x110000 * 4);
  for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp < 0xD800 || cp > 0xDFFF) append_utf8(text, cp);
  }
  return text;
}

// The code point ranges PCRE2's own tables give \p{category}: the matches of \p{category}+ over
// every scalar value. Null when PCRE2 does not know the name.
std::unique_ptr<std::vector<unicode::Range>> probe_category(const std::string& category) {
  const std::string pattern = "\\p{" + category + "}+";
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (code == nullptr) return nullptr;
  const bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  const std::string text = every_scalar_value();
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  pcre2_match_data* md = thread_match_data();
  auto ranges = std::make_unique<std::vector<unicode::Range>>();
  for (size_t pos = 0; pos < text.size();) {
    const int rc = jit ? pcre2_jit_match(code, subject, text.size(), pos, 0, md, nullptr)
                       : pcre2_match(code, subject, text.size(), pos, 0, md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t first = ov[0], last = ov[1] - 1;
    while ((static_cast<unsigned char>(text[last]) & 0xC0) == 0x80) --last;  // last char's start
    const char32_t lo = next_code_point(text, first), hi = next_code_point(text, last);
    if (lo < 0xD800 && hi > 0xDFFF) {  // a run across the surrogates, which the text skips
      ranges->push_back({lo, 0xD7FF});
      ranges->push_back({0xE000, hi});
    } else {
      ranges->push_back({lo, hi});
    }
    pos = ov[1];
  }
  pcre2_code_free(code);
  return ranges;
}

// probe_category, once per category and process (a few tens of milliseconds each).
const std::vector<unicode::Range>* pcre2_category(const std::string& category) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<std::vector<unicode::Range>>> probed;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = probed.find(category);
  if (it == probed.end()) it = probed.emplace(category, probe_category(category)).first;
  return it->second.get();
}

}  // namespace

SplitRegex::SplitRegex(const std::string& pattern, bool literal, const std::string& origin) {
  const uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto compile = [&](const std::string& p) {
    return pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), options, &err,
                         &err_offset, nullptr);
  };
  code_ = compile(literal ? pattern : rewrite_unicode_classes(pattern, origin, pcre2_category));
  if (code_ == nullptr) {
    // Report the error as found in the pattern the user wrote, not in the rewritten one.
    if (pcre2_code* original = compile(pattern)) {
      pcre2_code_free(original);
      fail(ErrorKind::kInternal,
           "{}: the split regex with explicit Unicode classes does not "
           "compile: {}",
           origin, pcre2_message(err));
    }
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
