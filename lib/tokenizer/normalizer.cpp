#include "tokenizer/normalizer.h"

#include "core/utf8.h"
#include "tokenizer/nfc.h"

namespace dstrain::tokenizer {

std::string replace_all(std::string_view text, std::string_view pattern, std::string_view with) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  for (size_t hit = text.find(pattern); hit != std::string_view::npos;
       hit = text.find(pattern, pos)) {
    out.append(text.substr(pos, hit - pos));
    out.append(with);
    pos = hit + pattern.size();
  }
  out.append(text.substr(pos));
  return out;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const NormalizerStep& step : steps_) {
    switch (step.kind) {
      case NormalizerStep::Kind::kNfc:
        if (!is_ascii(s)) s = nfc(s);  // ASCII is NFC already
        break;
      case NormalizerStep::Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.text);
        break;
      case NormalizerStep::Kind::kReplace:
        if (s.find(step.pattern) != std::string::npos) s = replace_all(s, step.pattern, step.text);
        break;
    }
  }
  return s;
}

}  // namespace dstrain::tokenizer
