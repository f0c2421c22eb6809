#pragma once
// POSIX shell quoting, so a printed command line (--dry-run, failure summaries) can be pasted into
// a shell and run as is. Words made only of safe characters are left bare; anything else is wrapped
// in single quotes, with an embedded ' written as '\''.

#include <string>
#include <string_view>
#include <vector>

namespace dstrain::launcher {

std::string shell_quote(std::string_view word);

// The words quoted and joined by single spaces.
std::string shell_join(const std::vector<std::string>& words);

}  // namespace dstrain::launcher
