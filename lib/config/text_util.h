#pragma once
// Small string helpers for the config module: case folding and the did-you-mean suggestion.

#include <string>
#include <string_view>
#include <vector>

namespace dstrain::config::detail {

std::string lower(std::string_view s);

// Levenshtein distance (insert, delete, substitute each cost 1).
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word`, if it is close enough to be a plausible typo (distance at most
// a third of the word's length, and at least 1 allowed); "" otherwise.
std::string closest(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace dstrain::config::detail
