#include "model/checkpointing.h"

#include <algorithm>
#include <cctype>

namespace dstrain::model {

const char* checkpointing_word(Checkpointing setting) {
  switch (setting) {
    case Checkpointing::kNone:
      return "false";
    case Checkpointing::kSelective:
      return "selective";
    case Checkpointing::kPlain:
      return "true";
    case Checkpointing::kOffload:
      return "offload";
  }
  return "?";
}

std::optional<Checkpointing> checkpointing_from_word(const std::string& word) {
  std::string lower = word;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  for (const Checkpointing s : kCheckpointingSettings) {
    if (lower == checkpointing_word(s)) return s;
  }
  return std::nullopt;
}

}  // namespace dstrain::model
