#pragma once
// The normalizer of a tokenizer.json as a list of steps, applied in order to each stretch of text
// between added tokens (as the reference does):
//   NFC      Unicode NFC (nfc.h)
//   Prepend  `text` put in front of non-empty text
//   Replace  every occurrence of the literal `pattern`, left to right, becomes `text`
// Llama 2, Mistral v0.1 and TinyLlama spell spaces as '▁' this way: Prepend("▁"), Replace(" ",
// "▁").

#include <string>
#include <string_view>
#include <vector>

namespace dstrain::tokenizer {

struct NormalizerStep {
  enum class Kind { kNfc, kPrepend, kReplace };
  Kind kind = Kind::kNfc;
  std::string pattern;  // kReplace: the (non-empty) string replaced
  std::string text;     // kPrepend: what is put in front; kReplace: the replacement
};

class Normalizer {
 public:
  Normalizer() = default;
  explicit Normalizer(std::vector<NormalizerStep> steps) : steps_(std::move(steps)) {}

  bool empty() const { return steps_.empty(); }
  // The normalized form of well-formed UTF-8 `text`.
  std::string apply(std::string_view text) const;

 private:
  std::vector<NormalizerStep> steps_;
};

// Every occurrence of the non-empty `pattern` in `text` replaced by `with`, left to right.
std::string replace_all(std::string_view text, std::string_view pattern, std::string_view with);

}  // namespace dstrain::tokenizer
