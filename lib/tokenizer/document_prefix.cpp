#include "tokenizer/document_prefix.h"

#include "core/error.h"

namespace dstrain::tokenizer {

std::vector<int32_t> document_prefix(const Tokenizer& tokenizer, const std::string& add_bos,
                                     const std::string& key) {
  if (add_bos == "auto") return tokenizer.post_processor_prefix();
  if (add_bos == "false") return {};
  if (add_bos != "true") {
    fail(ErrorKind::kConfig, "{}: expected auto, true or false, got \"{}\"", key, add_bos);
  }
  if (!tokenizer.bos_id()) {
    fail(ErrorKind::kConfig,
         "{}: true, but the tokenizer has no bos token (set bos_token in its "
         "tokenizer_config.json, or use auto or false)",
         key);
  }
  return {*tokenizer.bos_id()};
}

std::vector<int32_t> PrefixedTokenizer::encode(std::string_view text) const {
  if (prefix_.empty()) return base_.encode(text);
  std::vector<int32_t> ids = prefix_;
  const std::vector<int32_t> rest = base_.encode(text);
  ids.insert(ids.end(), rest.begin(), rest.end());
  return ids;
}

}  // namespace dstrain::tokenizer
