#include "tokenizer/added_tokens.h"

#include <algorithm>
#include <unordered_map>

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

}  // namespace dstrain::tokenizer
