#include "launcher/host_select.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "launcher/text_util.h"

namespace dstrain::launcher {
namespace {

// One "host[:s,s,...]" term of a filter; empty `slots` means the whole host.
struct FilterTerm {
  std::string host;
  std::vector<int> slots;
};

const HostEntry& find_host(const std::vector<HostEntry>& hosts, const std::string& name,
                           const char* flag, const std::string& hostfile_path) {
  for (const HostEntry& h : hosts) {
    if (h.host == name) return h;
  }
  fail(ErrorKind::kUsage, "{}: host '{}' is not in the hostfile {}", flag, name, hostfile_path);
}

std::vector<int> parse_slots(const std::string& list, const HostEntry& host, const char* flag) {
  std::vector<int> slots;
  for (const std::string& piece : split(list, ',')) {
    int slot = -1;
    if (!parse_int(piece, &slot) || slot < 0 || slot >= host.slots) {
      fail(ErrorKind::kUsage, "{}: slot '{}' of host '{}' is not in 0..{} (slots={})", flag, piece,
           host.host, host.slots - 1, host.slots);
    }
    if (std::find(slots.begin(), slots.end(), slot) != slots.end()) {
      fail(ErrorKind::kUsage, "{}: slot {} of host '{}' is named twice", flag, slot, host.host);
    }
    slots.push_back(slot);
  }
  std::sort(slots.begin(), slots.end());
  return slots;
}

std::map<std::string, FilterTerm> parse_filter(const std::string& text, const char* flag,
                                               const std::vector<HostEntry>& hosts,
                                               const std::string& hostfile_path) {
  std::map<std::string, FilterTerm> terms;
  for (const std::string& term : split(text, '@')) {
    size_t colon = term.find(':');
    FilterTerm parsed;
    parsed.host = term.substr(0, colon);
    if (parsed.host.empty()) {
      fail(ErrorKind::kUsage, "{} '{}': empty host name (expected host[:slot,slot]@host...)", flag,
           text);
    }
    const HostEntry& host = find_host(hosts, parsed.host, flag, hostfile_path);
    if (colon != std::string::npos) parsed.slots = parse_slots(term.substr(colon + 1), host, flag);
    if (terms.count(parsed.host) != 0) {
      fail(ErrorKind::kUsage, "{}: host '{}' is named twice", flag, parsed.host);
    }
    terms[parsed.host] = parsed;
  }
  return terms;
}

std::vector<int> all_slots(const HostEntry& host, int limit) {
  int n = limit < 0 ? host.slots : std::min(limit, host.slots);
  std::vector<int> slots;
  for (int i = 0; i < n; ++i) slots.push_back(i);
  return slots;
}

std::vector<int> without(const std::vector<int>& slots, const std::vector<int>& removed) {
  std::vector<int> out;
  for (int s : slots) {
    if (std::find(removed.begin(), removed.end(), s) == removed.end()) out.push_back(s);
  }
  return out;
}

void check_selection(const HostSelection& s) {
  if (!s.include.empty() && !s.exclude.empty()) {
    fail(ErrorKind::kUsage, "--include and --exclude are mutually exclusive");
  }
  bool counts = s.num_nodes >= 0 || s.num_gpus >= 0;
  if (counts && (!s.include.empty() || !s.exclude.empty())) {
    fail(ErrorKind::kUsage, "--num_nodes/--num_gpus cannot be combined with --include/--exclude");
  }
  if (s.num_nodes == 0 || s.num_nodes < -1) {
    fail(ErrorKind::kUsage, "--num_nodes must be >= 1, got {}", s.num_nodes);
  }
  if (s.num_gpus == 0 || s.num_gpus < -1) {
    fail(ErrorKind::kUsage, "--num_gpus must be >= 1, got {}", s.num_gpus);
  }
}

}  // namespace

std::vector<SelectedNode> select_hosts(const std::vector<HostEntry>& hosts,
                                       const HostSelection& selection,
                                       const std::string& hostfile_path) {
  check_selection(selection);
  std::map<std::string, FilterTerm> include, exclude;
  if (!selection.include.empty())
    include = parse_filter(selection.include, "--include", hosts, hostfile_path);
  if (!selection.exclude.empty())
    exclude = parse_filter(selection.exclude, "--exclude", hosts, hostfile_path);
  std::vector<SelectedNode> out;
  for (const HostEntry& host : hosts) {
    if (selection.num_nodes >= 0 && static_cast<int>(out.size()) == selection.num_nodes) break;
    std::vector<int> slots = all_slots(host, selection.num_gpus);
    if (!include.empty()) {
      auto it = include.find(host.host);
      if (it == include.end()) continue;
      if (!it->second.slots.empty()) slots = it->second.slots;
    }
    auto ex = exclude.find(host.host);
    if (ex != exclude.end())
      slots = ex->second.slots.empty() ? std::vector<int>{} : without(slots, ex->second.slots);
    if (!slots.empty()) out.push_back(SelectedNode{host, slots});
  }
  if (out.empty()) fail(ErrorKind::kUsage, "no host of {} is left to run on", hostfile_path);
  return out;
}

}  // namespace dstrain::launcher
