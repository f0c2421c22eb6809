#include "tokenizer/metaspace.h"

#include "tokenizer/normalizer.h"

namespace dstrain::tokenizer {

void metaspace_pieces(const MetaspaceSpec& spec, std::string_view text, bool at_start,
                      std::vector<std::string>& pieces) {
  const std::string& rep = spec.replacement;
  std::string s = replace_all(text, " ", rep);
  if (s.empty()) return;
  const bool starts_with_rep = s.compare(0, rep.size(), rep) == 0;
  const bool prepend =
      !starts_with_rep && (spec.prepend_scheme == PrependScheme::kAlways ||
                           (spec.prepend_scheme == PrependScheme::kFirst && at_start));
  if (prepend) s.insert(0, rep);
  if (!spec.split) {
    pieces.push_back(std::move(s));
    return;
  }
  // Each replacement character starts a piece; the text before the first one is a piece of its own.
  size_t start = 0;
  for (size_t hit = s.find(rep, 1); hit != std::string::npos; hit = s.find(rep, hit + rep.size())) {
    pieces.push_back(s.substr(start, hit - start));
    start = hit;
  }
  pieces.push_back(s.substr(start));
}

}  // namespace dstrain::tokenizer
