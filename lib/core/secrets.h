#pragma once
// Secret values never leave a dstrain process in clear. This module is the one place that decides
// which variables are secret and the one redaction every printer and record writer calls (console
// lines, error messages, dry runs, summaries, logs, traces, reports, MLflow params and tags).
//
// A variable is secret when its name contains TOKEN, SECRET, PASSWORD, KEY or CREDENTIAL (in any
// case), or when it was named secret: `dstrain launch --secret-env NAME`, which the launcher passes
// on to its agents and ranks in DSTRAIN_REDACT_VARS (comma-separated names; the name of that
// variable is not secret itself). Its value is known to this process once learn_environment() saw
// it, or add_secret_value() was called; from then on redact() replaces it by kRedacted wherever it
// appears. Values shorter than kMinRedactedLength are not searched for in free text (a secret "1"
// would blank every digit one); they are still shown as kRedacted wherever a NAME=VALUE pair is
// printed (shown_value) and still never put on a command line.
//
// The registry is process-wide (a secret is a property of the process, like its environment) and
// thread-safe: names and values are only ever added.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dstrain::secrets {

inline constexpr const char* kRedacted = "<redacted>";
inline constexpr const char* kExtraNamesVariable = "DSTRAIN_REDACT_VARS";
inline constexpr size_t kMinRedactedLength = 6;

// True when a variable called `name` holds a secret (see above).
bool is_secret_name(std::string_view name);

// Names that are secret beyond the built-in markers. Never fails: names are not validated here.
void add_secret_names(const std::vector<std::string>& names);

// The names added so far, sorted and without duplicates.
std::vector<std::string> added_secret_names();

// "A,B" as carried by DSTRAIN_REDACT_VARS.
std::string join_names(const std::vector<std::string>& names);
std::vector<std::string> split_names(std::string_view text);

// Adds the names listed in DSTRAIN_REDACT_VARS of `environ` (NAME=value strings, null-terminated),
// then records the value of every secret variable in it.
void learn_environment(const char* const* environ);

// Records one secret value (ignored when shorter than kMinRedactedLength).
void add_secret_value(std::string_view value);

// `text` with every known secret value replaced by kRedacted (leftmost first, longest first).
std::string redact(std::string_view text);

// What to print for variable `name`: kRedacted when the name is secret, else `value`.
std::string shown_value(std::string_view name, std::string_view value);

// redact() over a byte stream that arrives in arbitrary pieces (a pipe): a secret split across two
// pieces is still found. Bytes that could be the start of a secret are held back until the next
// piece shows whether they are (at most the longest secret's length minus one); finish() releases
// them. One stream per object; not thread-safe.
class StreamRedactor {
 public:
  std::string feed(std::string_view bytes);
  std::string finish();

 private:
  std::string pending_;
};

}  // namespace dstrain::secrets
