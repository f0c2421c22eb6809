#pragma once
// The Metaspace pre-tokenizer (Llama 2 files written by newer transformers, Mistral v0.3): each
// space becomes the replacement character ('▁'), the replacement is put in front of a stretch of
// text that does not start with it (prepend_scheme "always"; "first": only for the stretch at the
// very start of the input, not after an added token; "never"), and with `split` the text is cut
// before every replacement character ("▁Hello▁▁world" → "▁Hello", "▁", "▁world").

#include <string>
#include <string_view>
#include <vector>

namespace dstrain::tokenizer {

enum class PrependScheme { kAlways, kFirst, kNever };

struct MetaspaceSpec {
  std::string replacement = "\u2581";  // one character, UTF-8
  PrependScheme prepend_scheme = PrependScheme::kAlways;
  bool split = true;
};

// Appends the pre-tokens of `text`, a non-empty stretch between added tokens; `at_start`: it
// begins at the first byte of the input.
void metaspace_pieces(const MetaspaceSpec& spec, std::string_view text, bool at_start,
                      std::vector<std::string>& pieces);

}  // namespace dstrain::tokenizer
