#include "launcher/hostfile.h"

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "launcher/text_util.h"

namespace dstrain::launcher {
namespace {

struct LineRef {
  const std::string& path;
  int line;
};

int positive_int(const std::string& value, const char* key, const LineRef& at) {
  int parsed = 0;
  if (!parse_int(value, &parsed) || parsed < 1) {
    fail(ErrorKind::kInput, "{}:{}: {} must be a positive integer, got '{}'", at.path, at.line, key,
         value);
  }
  return parsed;
}

bool valid_host_name(const std::string& host) {
  if (host.empty() || host[0] == '-') return false;
  for (char c : host) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_';
    if (!ok) return false;
  }
  return true;
}

// "[user@]host[:port]" → entry fields.
void parse_address(const std::string& word, HostEntry* entry, const LineRef& at) {
  std::string rest = word;
  size_t atsign = rest.find('@');
  if (atsign != std::string::npos) {
    entry->user = rest.substr(0, atsign);
    rest = rest.substr(atsign + 1);
    if (!valid_host_name(entry->user)) {
      fail(ErrorKind::kInput, "{}:{}: invalid user name in '{}'", at.path, at.line, word);
    }
  }
  size_t colon = rest.find(':');
  if (colon != std::string::npos) {
    entry->ssh_port = positive_int(rest.substr(colon + 1), "the port after ':'", at);
    rest = rest.substr(0, colon);
  }
  if (!valid_host_name(rest)) {
    fail(ErrorKind::kInput,
         "{}:{}: invalid host name '{}' (expected [user@]host[:port] with letters, digits, '-', "
         "'.', '_')",
         at.path, at.line, rest);
  }
  entry->host = rest;
}

void parse_setting(const std::string& word, HostEntry* entry, const LineRef& at) {
  size_t eq = word.find('=');
  if (eq == std::string::npos) {
    fail(ErrorKind::kInput, "{}:{}: unexpected '{}' (expected slots=N or ssh_port=P)", at.path,
         at.line, word);
  }
  std::string key = word.substr(0, eq);
  std::string value = word.substr(eq + 1);
  if (key == "slots") {
    entry->slots = positive_int(value, "slots", at);
  } else if (key == "ssh_port") {
    int port = positive_int(value, "ssh_port", at);
    if (entry->ssh_port != 0 && entry->ssh_port != port) {
      fail(ErrorKind::kInput, "{}:{}: host:{} and ssh_port={} disagree", at.path, at.line,
           entry->ssh_port, port);
    }
    entry->ssh_port = port;
  } else {
    fail(ErrorKind::kInput, "{}:{}: unknown setting '{}' (expected slots=N or ssh_port=P)", at.path,
         at.line, key);
  }
}

HostEntry parse_line(const std::vector<std::string>& words, const LineRef& at) {
  HostEntry entry;
  entry.line = at.line;
  parse_address(words[0], &entry, at);
  for (size_t i = 1; i < words.size(); ++i) parse_setting(words[i], &entry, at);
  if (entry.slots == 0) {
    fail(ErrorKind::kInput, "{}:{}: host '{}' has no slots=N (the number of devices to use)",
         at.path, at.line, entry.host);
  }
  if (entry.ssh_port > 65535) {
    fail(ErrorKind::kInput, "{}:{}: SSH port {} is outside 1..65535", at.path, at.line,
         entry.ssh_port);
  }
  return entry;
}

}  // namespace

std::vector<HostEntry> parse_hostfile(const std::string& text, const std::string& path) {
  std::vector<HostEntry> hosts;
  std::istringstream in(text);
  std::string raw;
  for (int line = 1; std::getline(in, raw); ++line) {
    std::vector<std::string> words = split_words(strip_comment(raw));
    if (words.empty()) continue;
    HostEntry entry = parse_line(words, LineRef{path, line});
    for (const HostEntry& seen : hosts) {
      if (seen.host == entry.host && seen.ssh_port == entry.ssh_port) {
        fail(ErrorKind::kInput, "{}:{}: duplicate host '{}' (first on line {})", path, line,
             entry.host, seen.line);
      }
    }
    hosts.push_back(entry);
  }
  if (hosts.empty()) fail(ErrorKind::kInput, "hostfile {} lists no hosts", path);
  return hosts;
}

std::vector<HostEntry> read_hostfile(const std::string& path) {
  return parse_hostfile(read_text_file(path, "hostfile"), path);
}

}  // namespace dstrain::launcher
