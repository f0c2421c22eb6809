#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "core/error.h"
#include "core/utf8.h"

namespace dstrain::tokenizer {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
  std::unordered_map<std::string, size_t> index;
  for (const AddedToken& t : tokens) {
    if (t.content.empty()) continue;
    auto [it, inserted] = index.emplace(t.content, tokens_.size());
    if (inserted) {
      tokens_.push_back(t);
    } else {
      tokens_[it->second] = t;
    }
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<unsigned char>(tokens_[i].content[0])].push_back(
        static_cast<int>(i));
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](int a, int b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

int AddedTokenMatcher::longest_at(std::string_view text, size_t pos) const {
  for (int i : by_first_byte_[static_cast<unsigned char>(text[pos])]) {
    const std::string& c = tokens_[i].content;
    if (text.compare(pos, c.size(), c) == 0) return i;
  }
  return -1;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t start = 0;  // start of the current run of ordinary text
  size_t pos = 0;
  while (pos < text.size()) {
    const int hit =
        by_first_byte_[static_cast<unsigned char>(text[pos])].empty() ? -1 : longest_at(text, pos);
    if (hit < 0) {
      ++pos;
      continue;
    }
    if (pos > start) out.push_back({text.substr(start, pos - start), -1});
    const AddedToken& t = tokens_[hit];
    out.push_back({text.substr(pos, t.content.size()), t.id});
    pos += t.content.size();
    start = pos;
  }
  if (start < text.size()) out.push_back({text.substr(start), -1});
}

std::vector<std::string> added_contents(const std::vector<AddedToken>& tokens,
                                        int64_t& vocab_size) {
  for (const AddedToken& t : tokens) {
    if (t.id < 0) fail(ErrorKind::kInput, "added token '{}' has negative id {}", t.content, t.id);
    vocab_size = std::max<int64_t>(vocab_size, int64_t{t.id} + 1);
  }
  std::vector<std::string> contents(static_cast<size_t>(vocab_size));
  for (const AddedToken& t : tokens) contents[static_cast<size_t>(t.id)] = t.content;
  return contents;
}

void check_text_is_utf8(std::string_view text) {
  if (const std::optional<size_t> bad = find_invalid_utf8(text)) {
    fail(ErrorKind::kInput,
         "invalid UTF-8 at byte offset {} of the text to tokenize (byte 0x{:02X}); "
         "expected UTF-8 text",
         *bad, static_cast<unsigned char>(text[*bad]));
  }
}

}  // namespace dstrain::tokenizer
