#include "core/secrets.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>

namespace dstrain::secrets {
namespace {

constexpr const char* kMarkers[] = {"TOKEN", "SECRET", "PASSWORD", "KEY", "CREDENTIAL"};

using Values = std::vector<std::string>;  // longest first

// Readers take a snapshot of the values (one shared_ptr copy under the lock), so redact() on one
// thread never waits for a search on another.
struct Registry {
  std::mutex mutex;
  std::set<std::string> names;
  std::shared_ptr<const Values> values = std::make_shared<Values>();
};

Registry& registry() {
  static Registry r;
  return r;
}

std::shared_ptr<const Values> values_snapshot() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.values;
}

// The secret that occurs in `text` at `pos`, or nullptr.
const std::string* match_at(const Values& values, std::string_view text, size_t pos) {
  for (const std::string& v : values) {
    if (text.size() - pos >= v.size() && text.compare(pos, v.size(), v) == 0) return &v;
  }
  return nullptr;
}

// True when text[pos..] is too short to hold a secret starting there but is the start of one.
bool may_continue(const Values& values, std::string_view text, size_t pos) {
  const size_t rest = text.size() - pos;
  for (const std::string& v : values) {
    if (v.size() > rest && v.compare(0, rest, text.substr(pos)) == 0) return true;
  }
  return false;
}

// Copies `text` into `out` with secrets replaced; with `hold_partial`, stops at the first position
// that may begin a secret completed by bytes not seen yet and returns it (else text.size()).
size_t redact_into(const Values& values, std::string_view text, bool hold_partial,
                   std::string& out) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (const std::string* hit = match_at(values, text, pos)) {
      out += kRedacted;
      pos += hit->size();
      continue;
    }
    if (hold_partial && may_continue(values, text, pos)) break;
    out += text[pos++];
  }
  return pos;
}

}  // namespace

bool is_secret_name(std::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  for (const char* marker : kMarkers) {
    if (upper.find(marker) != std::string::npos) return true;
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.names.count(std::string(name)) > 0;
}

void add_secret_names(const std::vector<std::string>& names) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const std::string& name : names) {
    if (!name.empty()) r.names.insert(name);
  }
}

std::vector<std::string> added_secret_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return {r.names.begin(), r.names.end()};
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ",") + name;
  return out;
}

std::vector<std::string> split_names(std::string_view text) {
  std::vector<std::string> names;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view name = text.substr(0, comma);
    if (!name.empty()) names.emplace_back(name);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return names;
}

void learn_environment(const char* const* environ) {
  const size_t prefix = std::strlen(kExtraNamesVariable);
  for (const char* const* e = environ; e != nullptr && *e != nullptr; ++e) {
    if (std::strncmp(*e, kExtraNamesVariable, prefix) == 0 && (*e)[prefix] == '=')
      add_secret_names(split_names(*e + prefix + 1));
  }
  for (const char* const* e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr && is_secret_name(std::string_view(*e, static_cast<size_t>(eq - *e))))
      add_secret_value(eq + 1);
  }
}

void add_secret_value(std::string_view value) {
  if (value.size() < kMinRedactedLength) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (std::find(r.values->begin(), r.values->end(), value) != r.values->end()) return;
  auto values = std::make_shared<Values>(*r.values);
  values->emplace_back(value);
  std::stable_sort(values->begin(), values->end(),
                   [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  r.values = std::move(values);
}

std::string redact(std::string_view text) {
  std::shared_ptr<const Values> values = values_snapshot();
  std::string out;
  if (values->empty()) return std::string(text);
  out.reserve(text.size());
  redact_into(*values, text, /*hold_partial=*/false, out);
  return out;
}

std::string shown_value(std::string_view name, std::string_view value) {
  return is_secret_name(name) ? std::string(kRedacted) : redact(value);
}

std::string StreamRedactor::feed(std::string_view bytes) {
  std::shared_ptr<const Values> values = values_snapshot();
  pending_.append(bytes);
  std::string out;
  out.reserve(pending_.size());
  size_t used = redact_into(*values, pending_, /*hold_partial=*/true, out);
  pending_.erase(0, used);
  return out;
}

std::string StreamRedactor::finish() {
  std::string out = redact(pending_);
  pending_.clear();
  return out;
}

}  // namespace dstrain::secrets
